package pushlbk8s

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

func ptr[T any](v T) *T { return &v }

func svcOf(annotations map[string]string, ports ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Annotations: annotations}}
	for _, p := range ports {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: p, Port: 80})
	}
	return s
}

func sliceOf(name string, typ discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, AddressType: typ, Ports: ports, Endpoints: eps}
}

func podEP(pod, ip string, ready, serving, terminating *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: pod},
		Zone:       ptr("z1"),
	}
}

var httpPort = []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}}

// TestDesired covers what a real API server cannot be made to serve (an
// unknown address type is refused by its validation) and the condition
// table of the EndpointSlice API, nil conditions included.
func TestDesired(t *testing.T) {
	yes, no := ptr(true), ptr(false)
	for _, tc := range []struct {
		name     string
		svc      *corev1.Service
		slices   []*discoveryv1.EndpointSlice
		want     map[string]endpointState
		problems []string
	}{
		{name: "conditions", svc: svcOf(nil, "http"), slices: []*discoveryv1.EndpointSlice{sliceOf("s", discoveryv1.AddressTypeIPv4, httpPort,
			podEP("ready", "10.0.0.1", yes, yes, no),
			podEP("nil-conditions", "10.0.0.2", nil, nil, nil),
			podEP("not-ready", "10.0.0.3", no, no, no),
			podEP("draining", "10.0.0.4", no, yes, yes),
			podEP("terminated", "10.0.0.5", no, no, yes),
		)}, want: map[string]endpointState{"ns/ready:http": stateReady, "ns/nil-conditions:http": stateReady, "ns/draining:http": stateDraining}},
		{name: "unknown address type", svc: svcOf(nil, "http"), slices: []*discoveryv1.EndpointSlice{
			sliceOf("bogus", "Bogus", httpPort, podEP("a", "10.0.0.1", yes, yes, no)),
			sliceOf("v4", discoveryv1.AddressTypeIPv4, httpPort, podEP("b", "10.0.0.2", yes, yes, no)),
		}, want: map[string]endpointState{"ns/b:http": stateReady}, problems: []string{reasonAddressType}},
		{name: "other family ignored", svc: svcOf(nil, "http"), slices: []*discoveryv1.EndpointSlice{
			sliceOf("v6", discoveryv1.AddressTypeIPv6, httpPort, podEP("a", "fd00::1", yes, yes, no)),
		}, want: map[string]endpointState{}},
		{name: "missing ports", svc: svcOf(nil, "http"), slices: []*discoveryv1.EndpointSlice{
			sliceOf("s", discoveryv1.AddressTypeIPv4, nil, podEP("a", "10.0.0.1", yes, yes, no)),
		}, want: map[string]endpointState{}, problems: []string{reasonNoPorts}},
		{name: "no address", svc: svcOf(nil, "http"), slices: []*discoveryv1.EndpointSlice{
			sliceOf("s", discoveryv1.AddressTypeIPv4, httpPort, discoveryv1.Endpoint{TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "a"}}),
		}, want: map[string]endpointState{}, problems: []string{reasonNoAddress}},
		{name: "ambiguous port", svc: svcOf(nil, "http", "grpc"), problems: []string{reasonAmbiguousPort}},
		{name: "port chosen by annotation", svc: svcOf(map[string]string{AnnotationPort: "grpc"}, "http", "grpc"), slices: []*discoveryv1.EndpointSlice{
			sliceOf("s", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}, {Name: ptr("grpc"), Port: ptr(int32(9090))}},
				podEP("a", "10.0.0.1", yes, yes, no)),
		}, want: map[string]endpointState{"ns/a:grpc": stateReady}},
		{name: "invalid service name", svc: svcOf(map[string]string{AnnotationService: "a.b"}, "http"), problems: []string{reasonServiceName}},
		{name: "duplicate across slices: ready wins", svc: svcOf(nil, "http"), slices: []*discoveryv1.EndpointSlice{
			sliceOf("s1", discoveryv1.AddressTypeIPv4, httpPort, podEP("a", "10.0.0.1", no, yes, yes)),
			sliceOf("s2", discoveryv1.AddressTypeIPv4, httpPort, podEP("a", "10.0.0.1", yes, yes, no)),
		}, want: map[string]endpointState{"ns/a:http": stateReady}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, wants, problems := desired(tc.svc, tc.slices, nil, nil, DefaultOwner)
			got := map[string]endpointState{}
			for id, w := range wants {
				got[id] = w.state
				if err := w.in.Validate(); err != nil {
					t.Errorf("%s: %v", id, err)
				}
			}
			if tc.want == nil {
				tc.want = map[string]endpointState{}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("wants %v, want %v", got, tc.want)
			}
			for id, st := range tc.want {
				if got[id] != st {
					t.Errorf("%s: state %v, want %v", id, got[id], st)
				}
			}
			var reasons []string
			for _, p := range problems {
				reasons = append(reasons, p.reason)
			}
			if strings.Join(reasons, ",") != strings.Join(tc.problems, ",") {
				t.Errorf("problems %v, want %v", reasons, tc.problems)
			}
		})
	}
}

func TestInstanceIDLength(t *testing.T) {
	long := strings.Repeat("p", 253)
	ep := discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: long}}
	id := InstanceID(strings.Repeat("n", 63), ep, "http", 8080)
	if len(id) != events.MaxInstanceIDLength {
		t.Fatalf("ID of %d bytes, want %d", len(id), events.MaxInstanceIDLength)
	}
	if err := (serverlist.Instance{Service: "web", InstanceID: id, Host: "h", Port: 1}).Validate(); err != nil {
		t.Fatal(err)
	}
	if other := InstanceID(strings.Repeat("n", 63), ep, "grpc", 8080); other == id {
		t.Fatal("two ports of one long-named pod share an ID")
	}
	if got := InstanceID("ns", discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}}, "", 8080); got != "ns/10.0.0.1:8080" {
		t.Fatalf("ID of an endpoint without a pod: %q", got)
	}
}
