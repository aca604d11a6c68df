package pushlbk8s

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// endpointState is what the registry should say of an endpoint.
type endpointState int

const (
	// stateReady: announced.
	stateReady endpointState = iota + 1
	// stateDraining: serving and terminating: offline, record kept down.
	stateDraining
)

// want is one record a Service's slices call for. in has no Incarnation
// and an empty Status: the writer sets them.
type want struct {
	in    serverlist.Instance
	state endpointState
}

// problem is a malformed part of an object: logged and counted by reason.
type problem struct {
	reason string // metric label: short, fixed
	object string // "<kind> <namespace>/<name>"
	detail string
}

// Reasons of malformed objects (the pushlb_k8s_malformed_total label).
const (
	reasonNoPorts         = "missing_ports"
	reasonPortNumber      = "port_without_number"
	reasonAddressType     = "unknown_address_type"
	reasonNoAddress       = "endpoint_without_address"
	reasonServiceName     = "invalid_service_name"
	reasonAmbiguousPort   = "ambiguous_port"
	reasonInvalidInstance = "invalid_instance"
)

// podLabels returns the labels of the pod namespace/name and whether it is
// known.
type podLabels func(namespace, name string) (map[string]string, bool)

// desired computes the records a Service's slices call for: the pushlb
// service name, the wants by instance ID, and the problems found. A nil
// svc (deleted, or no longer selected) calls for nothing.
func desired(svc *corev1.Service, sl []*discoveryv1.EndpointSlice, labelKeys []string, pods podLabels, owner string) (string, map[string]want, []problem) {
	if svc == nil {
		return "", nil, nil
	}
	svcKey := svc.Namespace + "/" + svc.Name
	var problems []problem
	service := svc.Name
	if a := svc.Annotations[AnnotationService]; a != "" {
		service = a
	}
	if err := events.ValidateService(service); err != nil {
		return "", nil, []problem{{reasonServiceName, "Service " + svcKey, err.Error()}}
	}
	portName, ok := svc.Annotations[AnnotationPort]
	if !ok {
		if len(svc.Spec.Ports) != 1 {
			return service, nil, []problem{{reasonAmbiguousPort, "Service " + svcKey,
				fmt.Sprintf("%d ports and no %s annotation", len(svc.Spec.Ports), AnnotationPort)}}
		}
		portName = svc.Spec.Ports[0].Name
	}
	family := discoveryv1.AddressTypeIPv4
	if len(svc.Spec.IPFamilies) > 0 && svc.Spec.IPFamilies[0] == corev1.IPv6Protocol {
		family = discoveryv1.AddressTypeIPv6
	}
	secure := svc.Annotations[AnnotationSecure] == "true"

	// Slices in name order, so that a duplicate endpoint resolves the same
	// way every time.
	sl = slices.Clone(sl)
	slices.SortFunc(sl, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	wants := make(map[string]want)
	for _, s := range sl {
		obj := "EndpointSlice " + s.Namespace + "/" + s.Name
		switch s.AddressType {
		case family, discoveryv1.AddressTypeFQDN:
		case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
			continue // the other family of a dual-stack Service
		default:
			problems = append(problems, problem{reasonAddressType, obj, fmt.Sprintf("address type %.40q", s.AddressType)})
			continue
		}
		if len(s.Ports) == 0 {
			problems = append(problems, problem{reasonNoPorts, obj, "no ports"})
			continue
		}
		var port *discoveryv1.EndpointPort
		for i := range s.Ports {
			if ptrString(s.Ports[i].Name) == portName {
				port = &s.Ports[i]
				break
			}
		}
		if port == nil {
			continue // this slice's endpoints do not serve the port
		}
		if port.Port == nil || *port.Port < 1 || *port.Port > 65535 {
			problems = append(problems, problem{reasonPortNumber, obj, fmt.Sprintf("port %q has no valid number", portName)})
			continue
		}
		portSecure := secure || ptrString(port.AppProtocol) == "https"
		for _, ep := range s.Endpoints {
			st := stateOf(ep.Conditions)
			if st == 0 {
				continue
			}
			if len(ep.Addresses) == 0 || ep.Addresses[0] == "" {
				problems = append(problems, problem{reasonNoAddress, obj, "an endpoint has no address"})
				continue
			}
			in := serverlist.Instance{
				Service:    service,
				InstanceID: InstanceID(s.Namespace, ep, portName, int(*port.Port)),
				Host:       ep.Addresses[0],
				Port:       int(*port.Port),
				Secure:     portSecure,
				Zone:       ptrString(ep.Zone),
				Owner:      owner,
				Metadata:   map[string]string{MetaService: svcKey},
			}
			if n := ptrString(ep.NodeName); n != "" {
				in.Metadata[MetaNode] = n
			}
			if ref := ep.TargetRef; ref != nil && ref.Kind == "Pod" && len(labelKeys) > 0 && pods != nil {
				ns := ref.Namespace
				if ns == "" {
					ns = s.Namespace
				}
				if l, ok := pods(ns, ref.Name); ok {
					for _, k := range labelKeys {
						if v, ok := l[k]; ok {
							in.Metadata[k] = v
						}
					}
				}
			}
			if err := in.Validate(); err != nil {
				problems = append(problems, problem{reasonInvalidInstance, obj, err.Error()})
				continue
			}
			if prev, ok := wants[in.InstanceID]; ok && prev.state <= st {
				continue // listed twice (a move between slices): ready wins
			}
			wants[in.InstanceID] = want{in: in, state: st}
		}
	}
	return service, wants, problems
}

// stateOf reads an endpoint's conditions as the EndpointSlice API defines
// them: a nil ready means ready, a nil serving means as ready, a nil
// terminating means not terminating. 0: neither announced nor draining.
func stateOf(c discoveryv1.EndpointConditions) endpointState {
	ready := c.Ready == nil || *c.Ready
	serving := ready
	if c.Serving != nil {
		serving = *c.Serving
	}
	terminating := c.Terminating != nil && *c.Terminating
	switch {
	case terminating && serving:
		return stateDraining
	case ready && !terminating:
		return stateReady
	}
	return 0
}

// InstanceID is the instance ID of an endpoint for a Service port:
// "<namespace>/<pod>:<port>" for an endpoint of a pod, else
// "<namespace>/<address>:<port>", where <port> is the Service port's name,
// or its number when it has none. Kubernetes names hold only [a-z0-9.-],
// which pushlb's IDs accept as they are; an ID longer than
// events.MaxInstanceIDLength keeps its first bytes and ends in "~" and 16
// hex digits of the SHA-256 of the whole.
func InstanceID(namespace string, ep discoveryv1.Endpoint, portName string, port int) string {
	name := ""
	if ref := ep.TargetRef; ref != nil && ref.Kind == "Pod" && ref.Name != "" {
		name = ref.Name
		if ref.Namespace != "" {
			namespace = ref.Namespace
		}
	} else if len(ep.Addresses) > 0 {
		name = ep.Addresses[0]
	}
	if portName == "" {
		portName = strconv.Itoa(port)
	}
	id := namespace + "/" + name + ":" + portName
	if len(id) > events.MaxInstanceIDLength {
		sum := sha256.Sum256([]byte(id))
		suffix := "~" + hex.EncodeToString(sum[:8])
		id = id[:events.MaxInstanceIDLength-len(suffix)] + suffix
	}
	return id
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
