package serverlist

import (
	"context"

	"github.com/pushlb/pushlb/balancer"
)

// Server converts the registry's instance into a balancer server.
func (in Instance) Server() balancer.Server {
	scheme := "http"
	if in.Secure {
		scheme = "https"
	}
	return balancer.Server{
		ID: in.InstanceID, Host: in.Host, Port: in.Port, Scheme: scheme,
		Zone: in.Zone, Metadata: in.Metadata,
	}
}

// ServiceList is a balancer.ServerList backed by the registry for one
// service, so a polling balancer and the push path read the same source.
type ServiceList struct {
	Registry *Registry
	Service  string
}

// InitialServers implements balancer.ServerList.
func (l ServiceList) InitialServers(ctx context.Context) ([]balancer.Server, error) {
	return l.UpdatedServers(ctx)
}

// UpdatedServers implements balancer.ServerList.
func (l ServiceList) UpdatedServers(ctx context.Context) ([]balancer.Server, error) {
	ins, err := l.Registry.List(ctx, l.Service)
	if err != nil {
		return nil, err
	}
	out := make([]balancer.Server, len(ins))
	for i, in := range ins {
		out[i] = in.Server()
	}
	return out, nil
}

var _ balancer.ServerList = ServiceList{}
