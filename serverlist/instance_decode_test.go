package serverlist

import (
	"encoding/json"
	"reflect"
	"testing"
)

// parseSeeds are values in the usual shape and beside it.
var parseSeeds = []string{
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","host":"10.0.0.5","port":8080,"secure":false,"zone":"eu-west-1a","metadata":{"version":"1.4.2"},"incarnation":1732886400000000000}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","host":"h","port":1,"secure":true,"zone":"","weight":250,"incarnation":1,"owner":"3f9c","gossipNode":"n-1","gossipAddr":"10.0.0.5:7946","natsServerId":"NDRS","natsClientId":18446744073709551615}`,
	` { "service" : "orders" , "instanceId" : "10.0.0.5:orders:8080" , "metadata" : { } , "port" : -0 } `,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","metadata":{"a":"1","a":"2"}}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","host":"é€😀"}`,
	// encoding/json's (a fallback, or an error):
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","Host":"case"}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","host":"a\"b"}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","port":1.0}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","port":1e3}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","port":01}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","port":9223372036854775808}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","incarnation":-9223372036854775808}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","natsClientId":-1}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","zone":null}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","extra":[1,{"x":null}]}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","host":"a","host":"b"}`,
	`{"service":"billing","instanceId":"10.0.0.5:orders:8080"}`,
	`{"service":"orders"}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080"} x`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080",}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","host":"` + "\xff" + `"}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","secure":truex}`,
	`{"service":"orders","instanceId":"10.0.0.5:orders:8080","metadata":{"k":1}}`,
	`{}`, `[]`, ``, `{`,
}

// FuzzParseInstance: whatever parseInstance accepts, encoding/json
// decodes without an error to the same Instance, with or without an
// interner.
func FuzzParseInstance(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		checkParse(t, value)
	})
}

// TestParseInstance runs the seeds, and checks that the usual shapes take
// the fast path.
func TestParseInstance(t *testing.T) {
	accepted := 0
	for _, s := range parseSeeds {
		if checkParse(t, []byte(s)) {
			accepted++
		}
	}
	if accepted != 5 {
		t.Errorf("parseInstance accepted %d seeds, want the first 5", accepted)
	}
	// A record as the registry's own encoder writes it takes the fast path.
	in := Instance{Service: "orders", InstanceID: "i-1", Host: "h", Port: 80, Zone: "a",
		Metadata: map[string]string{"v": "1"}, Weight: 5, Incarnation: 1 << 62, Owner: "o",
		GossipNode: "n", GossipAddr: "h:1", NATSServerID: "S", NATSClientID: 7}
	_, val, err := encodeInstance(in)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := parseInstance(val, "orders", "i-1", nil)
	if !ok || !reflect.DeepEqual(got, in) {
		t.Fatalf("parseInstance(%s) = %+v, %v", val, got, ok)
	}
}

// checkParse reports whether parseInstance accepted value, and fails t if
// encoding/json disagrees with what it decoded.
func checkParse(t *testing.T, value []byte) bool {
	t.Helper()
	const service, id = "orders", "10.0.0.5:orders:8080"
	got, ok := parseInstance(value, service, id, nil)
	var x interner
	shared, sharedOK := parseInstance(value, service, id, &x)
	if ok != sharedOK || !reflect.DeepEqual(got, shared) {
		t.Fatalf("%q: with an interner %+v, %v; without %+v, %v", value, shared, sharedOK, got, ok)
	}
	if !ok {
		return false
	}
	var want Instance
	if err := json.Unmarshal(value, &want); err != nil {
		t.Fatalf("%q: parseInstance accepted what encoding/json refuses: %v", value, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: parseInstance = %+v, encoding/json = %+v", value, got, want)
	}
	return true
}

// BenchmarkDecodeValue: one record as announce writes it (owner,
// connection, gossip node, a label), decoded by encoding/json and by
// parseInstance with the mirror's interner, in the same run.
func BenchmarkDecodeValue(b *testing.B) {
	in := Instance{Service: "svc-17", InstanceID: "svc-17-i42-g0", Host: "10.0.17.42", Port: 8000,
		Zone: "b", Metadata: map[string]string{"version": "1.4.2"}, Incarnation: 1732886400000000000,
		Owner: "6b1f0c2d9e8a7f3b4c5d6e7f8a9b0c1d", GossipNode: "svc-17-i42-g0", GossipAddr: "10.0.17.42:7946",
		NATSServerID: "NDRS00000000000000000000000000000000000000000000000000001", NATSClientID: 1042}
	_, val, err := encodeInstance(in)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var out Instance
			if err := json.Unmarshal(val, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parseInstance", func(b *testing.B) {
		var x interner
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := parseInstance(val, in.Service, in.InstanceID, &x); !ok {
				b.Fatal("not parsed")
			}
		}
	})
}
