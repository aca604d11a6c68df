package yamlx_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pushlb/pushlb/internal/base/yamlx"
)

type natsConfig struct {
	URL     string        `yaml:"url"`
	Timeout time.Duration `yaml:"timeout"`
	TLS     *tlsConfig    `yaml:"tls"`
}

type tlsConfig struct {
	CA       string `yaml:"ca"`
	Insecure bool   `yaml:"insecure"`
}

type route struct {
	Prefix  string `yaml:"prefix"`
	Service string `yaml:"service"`
}

type common struct {
	Zone string `yaml:"zone"`
}

type config struct {
	common  `yaml:",inline"`
	Listen  string            `yaml:"listen"`
	Lease   time.Duration     `yaml:"lease"`
	Retries int               `yaml:"retries"`
	Ratio   float64           `yaml:"ratio"`
	Demo    bool              `yaml:"demo"`
	Peers   []string          `yaml:"peers"`
	NATS    natsConfig        `yaml:"nats"`
	Routes  []route           `yaml:"routes"`
	Labels  map[string]string `yaml:"labels"`
	Extra   map[string]route  `yaml:"extra"`
	Ignored string            `yaml:"-"`
}

func defaults() config {
	return config{
		Listen: ":8080",
		Lease:  30 * time.Second,
		Peers:  []string{"a:1"},
		NATS:   natsConfig{URL: "nats://x:4222", Timeout: time.Second, TLS: &tlsConfig{CA: "ca.pem"}},
	}
}

func TestDecodeFileValues(t *testing.T) {
	src := `
zone: a                    # an inlined struct's key
lease: 1m
retries: 3
ratio: 1
demo: yes
peers:                     # null keeps the default
nats:
  timeout: 0               # a bare 0 is a duration
  tls: {insecure: true}    # the CA stays
routes:
  - {prefix: /a, service: a}
labels: {team: x}
`
	got := defaults()
	if err := yamlx.DecodeFile("c.yaml", []byte(src), &got); err != nil {
		t.Fatal(err)
	}
	want := defaults()
	want.Zone = "a"
	want.Lease = time.Minute
	want.Retries = 3
	want.Ratio = 1
	want.Demo = true
	want.NATS.Timeout = 0
	want.NATS.TLS = &tlsConfig{CA: "ca.pem", Insecure: true}
	want.Routes = []route{{"/a", "a"}}
	want.Labels = map[string]string{"team": "x"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestDecodeFileAnchorsAndMerges(t *testing.T) {
	src := `
extra:
  one: &r {prefix: /one, service: one}
  two:
    <<: *r
    service: two
routes: [*r]
`
	var got config
	if err := yamlx.DecodeFile("c.yaml", []byte(src), &got); err != nil {
		t.Fatal(err)
	}
	if got.Extra["two"] != (route{"/one", "two"}) || len(got.Routes) != 1 || got.Routes[0] != (route{"/one", "one"}) {
		t.Errorf("got %+v", got)
	}
}

// A merge key merges nested structs key by key, as decoding over defaults
// does, and a null does not override what the merge brings.
func TestDecodeFileDeepMerge(t *testing.T) {
	type doc struct {
		Base   config `yaml:"base"`
		Server config `yaml:"server"`
	}
	in := `
base: &base
  listen: :1
  zone: z
  nats: {url: nats://base, timeout: 5s}
server:
  <<: *base
  zone: ~
  nats: {timeout: 1s}
`
	var got doc
	if err := yamlx.DecodeFile("c.yaml", []byte(in), &got); err != nil {
		t.Fatal(err)
	}
	want := config{Listen: ":1", common: common{Zone: "z"}, NATS: natsConfig{URL: "nats://base", Timeout: time.Second}}
	if !reflect.DeepEqual(got.Server, want) {
		t.Errorf("server = %+v\nwant %+v", got.Server, want)
	}
	err := yamlx.DecodeFile("c.yaml", []byte("base: &b {lisen: x}\nserver: {<<: *b}\n"), &got)
	if want := `c.yaml:1: base.lisen: unknown key (did you mean "listen"?)` + "\n" +
		`c.yaml:1: server.lisen: unknown key (did you mean "listen"?)`; err == nil || err.Error() != want {
		t.Errorf("error %v\nwant %s", err, want)
	}
	if err := yamlx.DecodeFile("c.yaml", []byte("server: {<<: [a]}\n"), &got); err == nil ||
		!strings.Contains(err.Error(), "merge key") {
		t.Errorf("merging a scalar: %v", err)
	}
}

// Merges of merges are bounded, as yaml.v3 bounds aliases, and a mapping
// cannot merge itself.
func TestDecodeFileMergeBombs(t *testing.T) {
	var src strings.Builder
	src.WriteString("extra:\n  r0: &r0 {prefix: /a}\n")
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&src, "  r%d: &r%d {<<: [*r%d, *r%d, *r%d]}\n", i, i, i-1, i-1, i-1)
	}
	src.WriteString("routes: [*r40]\n")
	type doc struct {
		Extra  map[string]route `yaml:"extra"`
		Routes []route          `yaml:"routes"`
	}
	var got doc
	err := yamlx.DecodeFile("c.yaml", []byte(src.String()), &got)
	if err == nil || !strings.Contains(err.Error(), "expand too much") {
		t.Errorf("merge bomb: %v", err)
	}
	err = yamlx.DecodeFile("c.yaml", []byte("routes:\n  - &a {prefix: /a, <<: [*a, *a]}\n"), &got)
	if err == nil {
		t.Error("a mapping merging itself: no error")
	}
}

func TestDecodeFileEmpty(t *testing.T) {
	for _, src := range []string{"", "# only a comment\n", "---\n", "~\n"} {
		got := defaults()
		if err := yamlx.DecodeFile("c.yaml", []byte(src), &got); err != nil {
			t.Errorf("%q: %v", src, err)
		}
		if !reflect.DeepEqual(got, defaults()) {
			t.Errorf("%q changed the value: %+v", src, got)
		}
	}
}

func TestDecodeFileErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want string // the whole message
	}{
		{"unknown top-level key", "listen: :1\nlisten_: x\n", `c.yaml:2: listen_: unknown key (did you mean "listen"?)`},
		{"unknown key, depth 2", "nats:\n  url: x\n  urll: y\n", `c.yaml:3: nats.urll: unknown key (did you mean "url"?)`},
		{"unknown key, depth 3", "nats:\n  tls:\n    insecur: true\n", `c.yaml:3: nats.tls.insecur: unknown key (did you mean "insecure"?)`},
		{"unknown key in a list item", "routes:\n  - prefix: /a\n    servce: a\n", `c.yaml:3: routes[0].servce: unknown key (did you mean "service"?)`},
		{"unknown key in a map value", "extra:\n  x: {prefix: /x, sevice: x}\n", `c.yaml:2: extra.x.sevice: unknown key (did you mean "service"?)`},
		{"unknown key, nothing close", "nats:\n  tls:\n    zzz: 1\n", `c.yaml:3: nats.tls.zzz: unknown key (the keys here are ca, insecure)`},
		{"skipped field", "ignored: x\n", `c.yaml:1: ignored: unknown key`},
		{"duration without unit", "lease: 30\n", `c.yaml:1: lease: "30" is not a duration (write it with a unit, e.g. 30s)`},
		{"bad duration", "nats:\n  timeout: soon\n", `c.yaml:2: nats.timeout: "soon" is not a duration (write it with a unit, e.g. 30s)`},
		{"list for a duration", "lease: [1s]\n", `c.yaml:1: lease: want a duration, not a list`},
		{"word for an int", "retries: many\n", `c.yaml:1: retries: "many" is not a whole number`},
		{"fraction for an int", "retries: 1.5\n", `c.yaml:1: retries: "1.5" is not a whole number`},
		{"int out of range", "retries: 99999999999999999999\n", `c.yaml:1: retries: "99999999999999999999" is not a whole number`},
		{"word for a float", "ratio: half\n", `c.yaml:1: ratio: "half" is not a number`},
		{"word for a bool", "demo: maybe\n", `c.yaml:1: demo: "maybe" is not a boolean (want true or false)`},
		{"deep bool", "nats:\n  tls: {insecure: 2}\n", `c.yaml:2: nats.tls.insecure: "2" is not a boolean (want true or false)`},
		{"scalar for a list", "peers: a:1\n", `c.yaml:1: peers: want a list, not "a:1"`},
		{"mapping for a list", "routes: {prefix: /a}\n", `c.yaml:1: routes: want a list, not a mapping`},
		{"mapping for a string", "listen: {a: b}\n", `c.yaml:1: listen: want a single value, not a mapping`},
		{"scalar for a struct", "nats: 5\n", `c.yaml:1: nats: want a mapping of settings, not "5"`},
		{"list item of the wrong type", "routes:\n  - /a\n", `c.yaml:2: routes[0]: want a mapping of settings, not "/a"`},
		{"repeated key", "listen: a\nlisten: b\n", `c.yaml:2: listen: repeated key (first at line 1)`},
		{"top level a list", "- a\n", `c.yaml:1: want a mapping of settings, not a list`},
		{"syntax", "nats:\n  url: [\n", `c.yaml:2: invalid YAML: did not find expected node content`},
		{"two documents", "listen: a\n---\nlisten: b\n", `c.yaml:2: a second YAML document; the file must hold one`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := defaults()
			err := yamlx.DecodeFile("c.yaml", []byte(tt.src), &got)
			if err == nil {
				t.Fatalf("no error; got %+v", got)
			}
			if !errors.Is(err, yamlx.ErrInvalid) {
				t.Errorf("%v does not wrap ErrInvalid", err)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %s\nwant %s", err, tt.want)
			}
		})
	}
}

func TestDecodeFileReportsEveryError(t *testing.T) {
	var got config
	err := yamlx.DecodeFile("c.yaml", []byte("demo: maybe\nlistn: x\nnats: {urll: y}\nlease: 5\n"), &got)
	want := `c.yaml:1: demo: "maybe" is not a boolean (want true or false)` + "\n" +
		`c.yaml:2: listn: unknown key (did you mean "listen"?)` + "\n" +
		`c.yaml:3: nats.urll: unknown key (did you mean "url"?)` + "\n" +
		`c.yaml:4: lease: "5" is not a duration (write it with a unit, e.g. 30s)`
	if err == nil || err.Error() != want {
		t.Errorf("error\n got %v\nwant %s", err, want)
	}
	if n := len(yamlx.Errors(err)); n != 4 {
		t.Errorf("Errors() found %d, want 4", n)
	}
}

// A check's errors are reported with decoding's, in line order, each on
// the line of its key (or of the nearest key written above it); a typo
// does not hide them, and one about a key decoding reported is left out.
func TestDecodeFileCheck(t *testing.T) {
	src := `lease: 1ms
retries: many
listn: x
nats:
  timeout: -1s
routes:
  - {prefix: /a, service: a}
  - prefix: /b
`
	errCheck := errors.New("check: invalid")
	var got config
	var seen config
	check := func() error {
		seen = got
		return errors.Join(
			&yamlx.Error{Path: "nats.timeout", Msg: "-1s is negative", Err: errCheck},
			&yamlx.Error{Path: "lease", Msg: "1ms is below the minimum 1s"},
			&yamlx.Error{Path: "routes[1].service", Msg: "empty"},
			&yamlx.Error{Path: "retries", Msg: "decoding said it first"},
			&yamlx.Error{Path: "listen", Msg: "not in the file"},
			errors.New("a problem of no key"),
		)
	}
	err := yamlx.DecodeFile("c.yaml", []byte(src), &got, yamlx.Check(check))
	want := `c.yaml: listen: not in the file` + "\n" +
		`c.yaml: a problem of no key` + "\n" +
		`c.yaml:1: lease: 1ms is below the minimum 1s` + "\n" +
		`c.yaml:2: retries: "many" is not a whole number` + "\n" +
		`c.yaml:3: listn: unknown key (did you mean "listen"?)` + "\n" +
		`c.yaml:5: nats.timeout: -1s is negative` + "\n" +
		`c.yaml:8: routes[1].service: empty`
	if err == nil || err.Error() != want {
		t.Errorf("error\n got %v\nwant %s", err, want)
	}
	if !errors.Is(err, errCheck) || !errors.Is(err, yamlx.ErrInvalid) {
		t.Errorf("%v should wrap the check's error and ErrInvalid", err)
	}
	if seen.Lease != time.Millisecond || len(seen.Routes) != 2 {
		t.Errorf("the check saw %+v, want what could be decoded", seen)
	}
	called := false
	err = yamlx.DecodeFile("c.yaml", []byte("nats: [\n"), &got, yamlx.Check(func() error { called = true; return nil }))
	if err == nil || called {
		t.Errorf("a file that does not parse: %v, checked %v", err, called)
	}
}

func TestDecodeNodeCommaListsAndPath(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("peers: \"a:1, b:2,\"\nlease: 3\n"), &doc); err != nil {
		t.Fatal(err)
	}
	var got config
	err := yamlx.DecodeNode(&doc, &got, yamlx.CommaLists(), yamlx.AtPath("gateway"))
	if want := `line 2: gateway.lease: "3" is not a duration (write it with a unit, e.g. 30s)`; err == nil || err.Error() != want {
		t.Errorf("error %v, want %s", err, want)
	}
	if !reflect.DeepEqual(got.Peers, []string{"a:1", "b:2"}) {
		t.Errorf("peers = %q", got.Peers)
	}
	if doc.Content[0].Content[1].Kind != yaml.ScalarNode {
		t.Error("DecodeNode changed its node")
	}
	if err := yamlx.DecodeNode(&doc, got); err == nil {
		t.Error("a non-pointer was accepted")
	}
}

// section decodes itself with DecodeNode, as lbconfig.Section does.
type section struct {
	Rules map[string]route
}

var errSection = errors.New("section: invalid")

func (s *section) UnmarshalYAML(n *yaml.Node) error {
	err := yamlx.DecodeNode(n, &s.Rules)
	for _, e := range yamlx.Errors(err) {
		e.Err = errSection
	}
	return err
}

type outer struct {
	Name    string  `yaml:"name"`
	Section section `yaml:"section"`
}

func TestDecodeFilePlacesAnUnmarshalersErrors(t *testing.T) {
	var got outer
	err := yamlx.DecodeFile("o.yaml", []byte("name: x\nsection:\n  a: {prefix: /a}\n  b: {prefx: /b}\n"), &got)
	if want := `o.yaml:4: section.b.prefx: unknown key (did you mean "prefix"?)`; err == nil || err.Error() != want {
		t.Errorf("error %v, want %s", err, want)
	}
	if !errors.Is(err, errSection) || !errors.Is(err, yamlx.ErrInvalid) {
		t.Errorf("%v should wrap both sentinels", err)
	}
	if err := yamlx.DecodeFile("o.yaml", []byte("section:\n  a: {prefix: /a}\n"), &got); err != nil || got.Section.Rules["a"].Prefix != "/a" {
		t.Errorf("good section: %v, %+v", err, got)
	}
}

// A section that decodes itself and fails does not stop the document:
// the keys after it are decoded and their errors reported with its own.
func TestDecodeFileGoesOnAfterAFailedUnmarshaler(t *testing.T) {
	type doc struct {
		Section section `yaml:"section"`
		Name    string  `yaml:"name"`
		Zone    string  `yaml:"zone"`
	}
	var got doc
	err := yamlx.DecodeFile("o.yaml", []byte("section:\n  b: {prefx: /b}\nname: [x]\nzone: z\n"), &got)
	want := `o.yaml:2: section.b.prefx: unknown key (did you mean "prefix"?)` + "\n" +
		`o.yaml:3: name: want a single value, not a list`
	if err == nil || err.Error() != want {
		t.Errorf("error\n got %v\nwant %s", err, want)
	}
	if got.Zone != "z" || !errors.Is(err, errSection) {
		t.Errorf("zone %q (want the key after the section decoded), error %v", got.Zone, err)
	}
}

func TestSuggest(t *testing.T) {
	keys := []string{"listOfServers", "rule", "retryTimeout", "zoneAware"}
	for key, want := range map[string]string{
		"ListOfServers": "listOfServers",
		"rul":           "rule",
		"retryTimout":   "retryTimeout",
		"zone":          "zoneAware",
		"xyz":           "",
	} {
		if got := yamlx.Suggest(key, keys); got != want {
			t.Errorf("Suggest(%q) = %q, want %q", key, got, want)
		}
	}
	if !strings.Contains((&yamlx.Error{File: "f", Line: 2, Path: "p", Msg: "m"}).Error(), "f:2: p: m") {
		t.Error("Error format")
	}
}
