package events

import "testing"

func TestListChangedEqual(t *testing.T) {
	l := func(service string, rev uint64, ids ...string) ListChanged {
		return ListChanged{Service: service, InstanceIDs: ids, Revision: rev}
	}
	tests := []struct {
		name string
		a, b ListChanged
		want bool
	}{
		{"same", l("orders", 1, "a", "b"), l("orders", 1, "a", "b"), true},
		{"order ignored", l("orders", 1, "b", "a"), l("orders", 1, "a", "b"), true},
		{"revision ignored", l("orders", 1, "a"), l("orders", 2, "a"), true},
		{"duplicates ignored", l("orders", 1, "a", "a", "b"), l("orders", 1, "b", "a"), true},
		{"both empty", l("orders", 1), l("orders", 2), true},
		{"nil and empty", ListChanged{Service: "orders"}, l("orders", 1, []string{}...), true},
		{"other service", l("orders", 1, "a"), l("billing", 1, "a"), false},
		{"one more", l("orders", 1, "a"), l("orders", 1, "a", "b"), false},
		{"one less", l("orders", 1, "a", "b"), l("orders", 1, "b"), false},
		{"other id", l("orders", 1, "a", "b"), l("orders", 1, "a", "c"), false},
		{"empty vs one", l("orders", 1), l("orders", 1, "a"), false},
	}
	for _, tt := range tests {
		if got := tt.a.Equal(tt.b); got != tt.want {
			t.Errorf("%s: Equal = %v, want %v", tt.name, got, tt.want)
		}
		if got := tt.b.Equal(tt.a); got != tt.want {
			t.Errorf("%s: Equal reversed = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestListChangedEqualDoesNotModify(t *testing.T) {
	a := ListChanged{Service: "s", InstanceIDs: []string{"c", "a", "b", "a"}}
	b := ListChanged{Service: "s", InstanceIDs: []string{"b", "c", "a"}}
	a.Equal(b)
	if got := a.InstanceIDs; got[0] != "c" || got[1] != "a" || got[2] != "b" || got[3] != "a" {
		t.Errorf("Equal modified its receiver: %q", got)
	}
}

func TestListChangedClone(t *testing.T) {
	a := ListChanged{Service: "s", InstanceIDs: []string{"a", "b"}, Revision: 3}
	c := a.Clone()
	c.InstanceIDs[0] = "z"
	if a.InstanceIDs[0] != "a" || !a.Equal(ListChanged{Service: "s", InstanceIDs: []string{"a", "b"}}) || c.Revision != 3 {
		t.Errorf("Clone shares memory or lost fields: %+v %+v", a, c)
	}
}
