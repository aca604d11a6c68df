package serverlist

import (
	"fmt"
	"maps"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestMirrorSharesRepeatedStrings: the records of a fleet that repeat a
// zone or a label share one copy of it in the mirror, their metadata is
// one map shared by the records that carry the same labels, and readers
// still get the metadata as a map of their own.
func TestMirrorSharesRepeatedStrings(t *testing.T) {
	m, ents := refreshFleet(t, 3, 4, MirrorConfig{})
	var zone, version *byte
	var set map[string]string
	for _, service := range m.Services() {
		for _, e := range m.state.Load().instances(service) {
			id, srv := e.rec.srv.ID, e.rec.srv
			if !maps.Equal(srv.Metadata, map[string]string{"version": "1.2.3"}) {
				t.Fatalf("%s/%s: labels %v, want version=1.2.3", service, id, srv.Metadata)
			}
			if zone == nil {
				zone, version, set = unsafe.StringData(srv.Zone), unsafe.StringData(srv.Metadata["version"]), srv.Metadata
			}
			if unsafe.StringData(srv.Zone) != zone || zone == nil || unsafe.StringData(srv.Metadata["version"]) != version || !sameMap(srv.Metadata, set) {
				t.Fatalf("%s/%s: zone or labels not shared with the other records", service, id)
			}
		}
	}
	// The entry's size class: 224 bytes with the fields of an Instance,
	// its revision and sum, a metadata map beside it; 160 with them in
	// smaller forms, the owner, gossip and connection fields included;
	// 96 with those in recordExt, allocated for the records that carry
	// them; 48 with the fields a balancer routes by in its server
	// (record.srv), which the balancer keeps instead of a copy; 32 with
	// a 64-bit sum and the record's two flags in the extension.
	if size := unsafe.Sizeof(mirrorEntry{}); size > 32 {
		t.Errorf("a mirror entry takes %d bytes, want at most 32", size)
	}
	// The extension's: 64 with the owner and the gossip address as
	// strings (and their bytes besides), 48 with the owner's bytes and
	// the address's port in their place, the strings that take no
	// smaller form apart (extStrings).
	if size := unsafe.Sizeof(recordExt{}); size > 48 {
		t.Errorf("a record's extension takes %d bytes, want at most 48", size)
	}

	// Readers get a map of their own.
	in, ok := m.Get("svc-1", "svc-1-i2-g0")
	if !ok || !maps.Equal(in.Metadata, map[string]string{"version": "1.2.3"}) {
		t.Fatalf("Get = %+v, %v", in, ok)
	}
	in.Metadata["version"] = "changed by a reader"
	if again, _ := m.Get("svc-1", "svc-1-i2-g0"); again.Metadata["version"] != "1.2.3" {
		t.Fatalf("a reader's change reached the mirror: %v", again.Metadata)
	}

	// A live change of the metadata is one; the same labels in other
	// bytes (another order) are a refresh.
	e := ents[5]
	var changes, refreshes int
	m.cfg.OnChange = func(string) { changes++ }
	m.cfg.OnRefresh = func(string, string, int64, uint64) { refreshes++ }
	cur, _ := m.Get(serviceOf(e.key), idOf(t, e.key))
	cur.Metadata = map[string]string{"version": "1.2.4", "track": "canary"}
	m.apply(put(t, e.key, cur), 1000, nil)
	if got, _ := m.Get(cur.Service, cur.InstanceID); changes != 1 || !got.Equal(cur) {
		t.Fatalf("after a change of labels: %d changes, Get = %+v, want %+v", changes, got, cur)
	}
	reordered := &fakeEntry{key: e.key, rev: 1001, val: []byte(fmt.Sprintf(
		`{"metadata":{"track":"canary","version":"1.2.4"},"service":%q,"instanceId":%q,"host":%q,"port":%d,"zone":%q,"incarnation":%d,"owner":%q}`,
		cur.Service, cur.InstanceID, cur.Host, cur.Port, cur.Zone, cur.Incarnation, cur.Owner))}
	m.apply(reordered, 1001, nil)
	if changes != 1 || refreshes != 1 {
		t.Fatalf("the same labels in another order: %d changes, %d refreshes, want 1 and 1", changes, refreshes)
	}
}

func serviceOf(key string) string {
	s, _, _ := strings.Cut(key, ".")
	return s
}

func idOf(t *testing.T, key string) string {
	_, id, err := DecodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func put(t *testing.T, key string, in Instance) *fakeEntry {
	_, val, err := encodeInstance(in)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeEntry{key: key, val: val}
}

// TestInternerBounds: the interner keeps one copy of short strings, up to
// its capacity, and hands longer ones and those beyond it back as they are.
func TestInternerBounds(t *testing.T) {
	var x interner
	a := x.intern(strings.Repeat("z", 3))
	if b := x.intern(strings.Repeat("z", 3)); unsafe.StringData(a) != unsafe.StringData(b) {
		t.Fatal("the same short string was not shared")
	}
	long := strings.Repeat("l", maxInternLen+1)
	if got := x.intern(long); unsafe.StringData(got) != unsafe.StringData(long) || len(x.m) != 1 {
		t.Fatalf("a string of %d bytes was kept (%d held)", len(long), len(x.m))
	}
	for i := len(x.m); i < maxInterned; i++ {
		x.intern(fmt.Sprint(i))
	}
	extra := "one more"
	if got := x.intern(extra); unsafe.StringData(got) != unsafe.StringData(extra) || len(x.m) != maxInterned {
		t.Fatalf("beyond the bound: %d held, want %d", len(x.m), maxInterned)
	}
	if x.intern("") != "" {
		t.Fatal("empty string")
	}
}

// TestLabelSets: records with the same labels, in any order, share one
// map; other labels get another; a set too large to keep is the record's
// own, equal all the same.
func TestLabelSets(t *testing.T) {
	var x interner
	var s labelSets
	a := s.of(map[string]string{"version": "1", "team": "x"}, &x)
	if b := s.of(map[string]string{"team": "x", "version": "1"}, &x); !sameMap(a, b) {
		t.Fatal("the same labels got two sets")
	}
	if want := map[string]string{"team": "x", "version": "1"}; !maps.Equal(a, want) {
		t.Fatalf("set %v, want %v", a, want)
	}
	// Keys and values that would read alike if simply joined.
	if c := s.of(map[string]string{"version": "1t", "eam": "x"}, &x); sameMap(c, a) {
		t.Fatal("other labels share a set")
	}
	if s.of(nil, &x) != nil || s.of(map[string]string{}, &x) != nil {
		t.Fatal("no labels")
	}
	big := map[string]string{"k": strings.Repeat("v", maxLabelSetKey)}
	b1, b2 := s.of(big, &x), s.of(big, &x)
	if sameMap(b1, b2) || !maps.Equal(b1, big) || !maps.Equal(b2, big) {
		t.Fatalf("a set over maxLabelSetKey: shared %v, equal %v %v", sameMap(b1, b2), maps.Equal(b1, big), maps.Equal(b2, big))
	}
}

// sameMap reports whether a and b are one map.
func sameMap(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// TestMirrorVersions: Versions yields every instance of a service, in ID
// order, with the incarnation and revision Entries reports, and stops
// when told to.
func TestMirrorVersions(t *testing.T) {
	m, _ := refreshFleet(t, 2, 5, MirrorConfig{})
	want := make(map[string]Version)
	for _, e := range m.Entries("svc-1") {
		want[e.InstanceID] = Version{Incarnation: e.Incarnation, Revision: e.Revision}
	}
	got := maps.Collect(m.Versions("svc-1"))
	if len(want) != 5 || !maps.Equal(got, want) {
		t.Fatalf("Versions = %v, want %v", got, want)
	}
	var order []string
	for id := range m.Versions("svc-1") {
		order = append(order, id)
	}
	if !slices.IsSorted(order) {
		t.Fatalf("Versions yields %v, not in ID order", order)
	}
	n := 0
	for range m.Versions("svc-1") {
		if n++; n == 2 {
			break
		}
	}
	if n != 2 || len(maps.Collect(m.Versions("none"))) != 0 {
		t.Fatalf("stopped after %d, or a service without instances yields", n)
	}
}

// TestConnIndexOneAndMore: a connection moves between the index's two
// maps as it comes to hold one record, several, and one again, and keys
// always lists what it holds; a slice handed to a reader is never
// modified.
func TestConnIndexOneAndMore(t *testing.T) {
	var x connIndex
	c, other := connKey{x.intern("S"), 1}, connKey{x.intern("S"), 2}
	if c.server != other.server {
		t.Fatal("one server ID interned twice")
	}
	conn := func(k connKey) Connection { return Connection{ServerID: *k.server, ClientID: k.client} }
	const service = "s"
	ids := func(c connKey) []string {
		var out []string
		for _, k := range x.keys(conn(c)) {
			if *k.service != service || k.service != x.services[service] {
				t.Fatalf("key %q/%s: service not the interned %q", *k.service, k.id, service)
			}
			out = append(out, k.id)
		}
		slices.Sort(out)
		return out
	}
	check := func(step string, want ...string) {
		t.Helper()
		if got := ids(c); !slices.Equal(got, want) {
			t.Fatalf("%s: keys %v, want %v", step, got, want)
		}
		_, inOne := x.one[c]
		_, inMore := x.more[c]
		if inOne && inMore || inOne != (len(want) == 1) || inMore != (len(want) > 1) {
			t.Fatalf("%s: in one %v, in more %v, for %d records", step, inOne, inMore, len(want))
		}
	}
	x.update(service, "a", connKey{}, c)
	check("one record", "a")
	x.update(service, "b", connKey{}, c)
	check("two", "a", "b")
	held := x.keys(conn(c))
	x.update(service, "d", connKey{}, c)
	check("three", "a", "b", "d")
	if len(held) != 2 {
		t.Fatalf("a reader's slice changed: %v", held)
	}
	x.update(service, "a", c, other)
	check("a moved away", "b", "d")
	x.update(service, "d", c, connKey{})
	check("d removed", "b")
	x.update(service, "b", c, connKey{})
	check("none")
	if got := ids(other); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("other: %v", got)
	}
}

// TestConnIndexRebuild: a rebuild keeps the interned server IDs and
// service names of the records it indexes, forgets the others, and the
// records compacted after it are found under the same IDs, whether the
// rebuild kept them or forgot them.
func TestConnIndexRebuild(t *testing.T) {
	var m Mirror
	on := func(service, id, server string, client uint64) *mirrorEntry {
		in := Instance{Service: service, InstanceID: id, Host: "h", Port: 1, NATSServerID: server, NATSClientID: client}
		return m.compact(in, id, 0, 1, false, nil)
	}
	found := func(c Connection) []string {
		var out []string
		for _, k := range m.conns.keys(c) {
			out = append(out, *k.service+"/"+k.id)
		}
		slices.Sort(out)
		return out
	}
	gone := on("s", "a", "S", 1)
	m.conns.update("s", "a", connKey{}, gone.connKey())
	kept := on("t", "b", "T", 2)
	m.conns.rebuild(map[string]map[string]*mirrorEntry{"t": {"b": kept}})
	if got := found(Connection{ServerID: "S", ClientID: 1}); got != nil {
		t.Fatalf("after the rebuild, S/1 holds %v", got)
	}
	if _, ok := m.conns.servers["S"]; ok {
		t.Fatal("the rebuild kept a server ID no record names")
	}
	if _, ok := m.conns.services["s"]; ok {
		t.Fatal("the rebuild kept a service name no record names")
	}
	if got := found(Connection{ServerID: "T", ClientID: 2}); !slices.Equal(got, []string{"t/b"}) {
		t.Fatalf("after the rebuild, T/2 holds %v", got)
	}
	again, more := on("s", "a", "S", 1), on("t", "c", "T", 3)
	if more.connKey().server != kept.connKey().server {
		t.Fatal("a server ID the rebuild kept was interned again")
	}
	m.conns.update("s", "a", connKey{}, again.connKey())
	m.conns.update("t", "c", connKey{}, more.connKey())
	if got := found(Connection{ServerID: "S", ClientID: 1}); !slices.Equal(got, []string{"s/a"}) {
		t.Fatalf("S/1 holds %v", got)
	}
	if got := found(Connection{ServerID: "T", ClientID: 3}); !slices.Equal(got, []string{"t/c"}) {
		t.Fatalf("T/3 holds %v", got)
	}
}

// TestDefaultGossipNode: a record whose gossip node has gossip's default
// name keeps a flag instead of the name and gives the same name back;
// any other name is kept as it is.
func TestDefaultGossipNode(t *testing.T) {
	const service, id, inc = "orders", "10.0.0.1:orders:8080", int64(1700000000123456789)
	name := defaultGossipNode(service, id, inc)
	if name != "orders/10.0.0.1:orders:8080/1700000000123456789" {
		t.Fatalf("defaultGossipNode = %q", name)
	}
	for _, tc := range []struct {
		node string
		want bool
	}{
		{name, true},
		{"orders/10.0.0.1:orders:8080/1700000000123456788", false},
		{"orders/10.0.0.1:orders:8081/1700000000123456789", false},
		{"order/10.0.0.1:orders:8080/1700000000123456789", false},
		{"orders/10.0.0.1:orders:8080/", false},
		{"orders/10.0.0.1:orders:8080", false},
		{"orders", false},
		{"", false},
		{"node-a", false},
	} {
		if got := isDefaultGossipNode(tc.node, service, id, inc); got != tc.want {
			t.Errorf("isDefaultGossipNode(%q) = %v, want %v", tc.node, got, tc.want)
		}
	}
	var m Mirror
	for _, node := range []string{name, "node-a", ""} {
		in := Instance{Service: service, InstanceID: id, Host: "10.0.0.1", Port: 8080, Incarnation: inc, GossipNode: node, GossipAddr: "10.0.0.1:7946"}
		e := m.compact(in, id, 0, 1, false, nil)
		if e.rec.gossipDefault() != (node == name) {
			t.Errorf("%q: kept as the default name: %v", node, e.rec.gossipDefault())
		}
		if got := e.instance(service); !got.Equal(in) || !e.holds(in) {
			t.Errorf("%q: read back %+v, want %+v", node, got, in)
		}
	}
}

// TestRecordExtension: a record keeps its owner, gossip and connection
// fields in an extension only when it carries one of them (a regional
// copy's connection and a default gossip name are not kept), and reads
// back the instance it was made of either way.
func TestRecordExtension(t *testing.T) {
	const service, id = "orders", "10.0.0.1:orders:8080"
	bare := Instance{Service: service, InstanceID: id, Host: "10.0.0.1", Port: 8080, Zone: "a", Incarnation: 7}
	with := func(f func(*Instance)) Instance {
		in := bare
		f(&in)
		return in
	}
	var m Mirror
	for _, tc := range []struct {
		name     string
		in       Instance
		regional bool
		ext      bool
		strs     bool // extStrings kept
	}{
		{"bare", bare, false, false, false},
		{"owner", with(func(in *Instance) { in.Owner = "3f9c0a7e5b1d2c4e3f9c0a7e5b1d2c4e" }), false, true, false},
		{"owner not in hex", with(func(in *Instance) { in.Owner = "3F9C0A7E5B1D2C4E3F9C0A7E5B1D2C4E" }), false, true, true},
		{"gossip node", with(func(in *Instance) { in.GossipNode = "node-a" }), false, true, true},
		{"default gossip node", with(func(in *Instance) { in.GossipNode = defaultGossipNode(service, id, 7) }), false, true, false},
		{"gossip address", with(func(in *Instance) { in.GossipAddr = "10.0.0.1:7946" }), false, true, false},
		{"gossip address of another host", with(func(in *Instance) { in.GossipAddr = "10.0.0.2:7946" }), false, true, true},
		{"server", with(func(in *Instance) { in.NATSServerID = "NSERVER" }), false, true, false},
		{"client", with(func(in *Instance) { in.NATSClientID = 9 }), false, true, false},
		{"regional connection", with(func(in *Instance) { in.NATSServerID, in.NATSClientID = "NSERVER", 9 }), true, true, false},
		{"regional owner", with(func(in *Instance) { in.Owner, in.NATSServerID, in.NATSClientID = "o", "NSERVER", 9 }), true, true, true},
		{"announce", with(func(in *Instance) {
			in.Owner, in.GossipNode, in.GossipAddr = "3f9c0a7e5b1d2c4e3f9c0a7e5b1d2c4e", defaultGossipNode(service, id, 7), "10.0.0.1:7946"
			in.NATSServerID, in.NATSClientID = "NSERVER", 9
		}), false, true, false},
	} {
		e := m.compact(tc.in, id, 0, 1, tc.regional, nil)
		if (e.rec.ext != nil) != tc.ext {
			t.Errorf("%s: extension %+v, want one: %v", tc.name, e.rec.ext, tc.ext)
		}
		want := tc.in
		if tc.regional {
			want.NATSServerID, want.NATSClientID = "", 0
		}
		if got := e.instance(service); !got.Equal(want) || !e.holds(want) {
			t.Errorf("%s: read back %+v, want %+v", tc.name, got, want)
		}
		if got := e.instance(service).Connection(); got != (Connection{ServerID: want.NATSServerID, ClientID: want.NATSClientID}) {
			t.Errorf("%s: connection %v", tc.name, got)
		}
		if !sameInstance(e, m.compact(tc.in, id, 0, 2, tc.regional, nil)) {
			t.Errorf("%s: not the same instance as itself", tc.name)
		}
		if tc.name != "bare" && !tc.regional && (sameInstance(e, m.compact(bare, id, 0, 2, false, nil)) || e.holds(bare)) {
			t.Errorf("%s: the same instance as the bare one", tc.name)
		}
		// The entry, its server, its extension if it has one and the
		// extension's strings if it keeps any (an owner not in hex, a
		// gossip node not named by default): nothing more (its zone and server ID
		// are the mirror's already).
		allocs := 2.0 // the entry and its server
		if tc.ext {
			allocs = 3
		}
		if tc.strs {
			allocs = 4
		}
		if got := e.rec.ext != nil && e.rec.ext.more != nil; got != tc.strs {
			t.Errorf("%s: strings kept apart: %v, want %v", tc.name, got, tc.strs)
		}
		if a := testing.AllocsPerRun(100, func() { m.compact(tc.in, id, 0, 1, tc.regional, nil) }); a != allocs {
			t.Errorf("%s: %v allocations, want %v", tc.name, a, allocs)
		}
	}
}

// TestPackedOwner: an owner in lowercase hex of at most 32 characters (a
// publisher's token: 24) is kept as the bytes it encodes and read back
// identical; any other (upper or mixed case, an odd or greater length, not
// hex) is kept as it is. Owners that differ only in case or length are
// never the same.
func TestPackedOwner(t *testing.T) {
	const service, id = "orders", "10.0.0.1:orders:8080"
	owners := []struct {
		owner string
		n     uint8 // bytes kept; 0: kept as a string
	}{
		{"3f9c0a7e5b1d2c4e3f9c0a7e5b1d2c4e", 16},
		{"00000000000000000000000000000000", 16},
		{"ffffffffffffffffffffffffffffffff", 16},
		{"0123456789abcdef01234567", 12}, // publisher.newOwner's length
		{"0123456789abcdef0123456789abcdef", 16},
		{"0a", 1},
		{"3F9C0A7E5B1D2C4E3F9C0A7E5B1D2C4E", 0},
		{"3f9c0a7e5b1d2c4e3f9c0a7e5b1d2c4E", 0},
		{"3f9c0a7e5b1d2c4e3f9c0a7e5b1d2c4e00", 0}, // 34 characters
		{"3f9c0a7e5b1d2c4e3f9c0a7e5b1d2c4", 0},    // 31
		{"3f9c0a7e5b1d2c4e3f9c0a7e5b1d2c4g", 0},
		{"3f9c0a7e-5b1d-2c4e-3f9c-0a7e5b1d2c4e", 0},
		{"a", 0},
		{"o", 0},
		{"", 0},
	}
	var m Mirror
	var entries []*mirrorEntry
	for _, tc := range owners {
		in := Instance{Service: service, InstanceID: id, Host: "10.0.0.1", Port: 8080, Incarnation: 7, Owner: tc.owner}
		e := m.compact(in, id, 0, 1, false, nil)
		var n uint8
		if e.rec.ext != nil {
			n = e.rec.ext.ownerLen
		}
		if n != tc.n {
			t.Errorf("%q: %d bytes kept, want %d", tc.owner, n, tc.n)
		}
		if got := e.instance(service); got.Owner != tc.owner || !got.Equal(in) || !e.holds(in) {
			t.Errorf("%q: read back owner %q", tc.owner, got.Owner)
		}
		if tc.n != 0 {
			// The owner's string, nothing more: its hex is encoded on
			// the stack.
			if a := testing.AllocsPerRun(100, func() { _ = e.base(service) }); a != 1 {
				t.Errorf("%q: base allocates %v times, want 1", tc.owner, a)
			}
		}
		entries = append(entries, e)
	}
	checkPairs(t, service, entries, func(i int) string { return "owner " + strconv.Quote(owners[i].owner) },
		func(in *Instance, j int) { in.Owner = owners[j].owner },
		func(i, j int) bool { return i == j })
}

// checkPairs checks every pair of entries of service, each named by name:
// i and j are the same instance only when i is j, and i holds its own
// instance given j's value (set) only where held(i, j).
func checkPairs(t *testing.T, service string, entries []*mirrorEntry, name func(i int) string, set func(in *Instance, j int), held func(i, j int) bool) {
	t.Helper()
	for i, a := range entries {
		for j, b := range entries {
			if same := sameInstance(a, b); same != (i == j) {
				t.Errorf("%s and %s: the same instance: %v", name(i), name(j), same)
			}
			other := a.instance(service)
			set(&other, j)
			if got := a.holds(other); got != held(i, j) {
				t.Errorf("%s holds one with %s: %v", name(i), name(j), got)
			}
		}
	}
}

// TestPackedGossipAddr: a gossip address that is the record's host and a
// port, as net.JoinHostPort writes them (IPv6 in brackets), is kept as its
// port and read back identical; any other is kept as it is. Addresses that
// differ in any byte are never the same.
func TestPackedGossipAddr(t *testing.T) {
	const service, id = "orders", "i-1"
	addrs := []struct {
		host, addr string
		port       uint16 // kept; 0: kept as a string
	}{
		{"10.0.0.1", "10.0.0.1:7946", 7946},
		{"10.0.0.1", "10.0.0.1:1", 1},
		{"10.0.0.1", "10.0.0.1:65535", 65535},
		{"10.0.0.1", "10.0.0.1:65536", 0},
		{"10.0.0.1", "10.0.0.1:100000", 0},
		{"10.0.0.1", "10.0.0.1:0", 0},
		{"10.0.0.1", "10.0.0.1:07946", 0},
		{"10.0.0.1", "10.0.0.1:+7946", 0},
		{"10.0.0.1", "10.0.0.1:7946 ", 0},
		{"10.0.0.1", "10.0.0.1:", 0},
		{"10.0.0.1", "10.0.0.1", 0},
		{"10.0.0.1", "10.0.0.10:7946", 0},
		{"10.0.0.1", "10.0.0.2:7946", 0},
		{"10.0.0.1", "[10.0.0.1]:7946", 0},
		{"10.0.0.1", "node-a.example:7946", 0},
		{"10.0.0.1", "", 0},
		{"fd00::1", "[fd00::1]:7946", 7946},
		{"fd00::1", "fd00::1:7946", 0},
		{"fd00::1", "[fd00::0001]:7946", 0},
		{"fd00::1", "[fd00::1]7946", 0},
		{"fe80::1%eth0", "[fe80::1%eth0]:7946", 7946},
		{"node-a.example", "node-a.example:7946", 7946},
		{"node-a.example", "10.0.0.1:7946", 0},
	}
	var m Mirror
	var entries []*mirrorEntry
	for _, tc := range addrs {
		if got := gossipPortOf(tc.addr, tc.host); got != tc.port {
			t.Errorf("gossipPortOf(%q, %q) = %d, want %d", tc.addr, tc.host, got, tc.port)
		}
		if tc.port != 0 {
			if got, join := gossipAddrOf(tc.host, tc.port), net.JoinHostPort(tc.host, strconv.Itoa(int(tc.port))); got != tc.addr || join != tc.addr {
				t.Errorf("gossipAddrOf(%q, %d) = %q, net.JoinHostPort %q, want %q", tc.host, tc.port, got, join, tc.addr)
			}
		}
		in := Instance{Service: service, InstanceID: id, Host: tc.host, Port: 8080, Incarnation: 7, GossipAddr: tc.addr}
		e := m.compact(in, id, 0, 1, false, nil)
		var port uint16
		if e.rec.ext != nil {
			port = e.rec.ext.gossipPort
		}
		if port != tc.port {
			t.Errorf("%q of %q: port %d kept, want %d", tc.addr, tc.host, port, tc.port)
		}
		if got := e.instance(service); got.GossipAddr != tc.addr || !got.Equal(in) || !e.holds(in) {
			t.Errorf("%q of %q: read back %q", tc.addr, tc.host, got.GossipAddr)
		}
		if tc.port != 0 {
			// The address's string, nothing more.
			if a := testing.AllocsPerRun(100, func() { _ = e.base(service) }); a != 1 {
				t.Errorf("%q: base allocates %v times, want 1", tc.addr, a)
			}
		}
		entries = append(entries, e)
	}
	checkPairs(t, service, entries, func(i int) string { return fmt.Sprintf("gossip address %q of %q", addrs[i].addr, addrs[i].host) },
		func(in *Instance, j int) { in.GossipAddr = addrs[j].addr },
		func(i, j int) bool { return addrs[i].addr == addrs[j].addr })

	// A record as announce writes it keeps no string in its extension.
	in := Instance{Service: service, InstanceID: id, Host: "fd00::1", Port: 8080, Incarnation: 7,
		Owner: "0123456789abcdef01234567", GossipNode: defaultGossipNode(service, id, 7), GossipAddr: "[fd00::1]:40123",
		NATSServerID: "NSERVER", NATSClientID: 9}
	e := m.compact(in, id, 0, 1, false, nil)
	if e.rec.ext == nil || e.rec.ext.more != nil || !e.holds(in) {
		t.Errorf("announce's record: extension %+v", e.rec.ext)
	}
}
