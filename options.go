package pushlb

import (
	"errors"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/lbhttp"
)

// Option sets what a Config does not hold: the logger, the hooks, and the
// options of the HTTP layer. Each checks its own value; New reports every
// problem at once, wrapping ErrInvalidOption and naming the option.
type Option func(*options) error

// options is what New works from: the resolved Config and the Options.
type options struct {
	Config
	log       zerolog.Logger
	onEvent   func(events.Event)
	onList    ListObserver
	transport []lbhttp.Option
	proxy     []lbhttp.ProxyOption
}

// WithLogger sets the logger: one info line per list change, warnings for
// dropped input (rate-limited) and failures. Default: no logs.
func WithLogger(l zerolog.Logger) Option {
	return func(o *options) error {
		o.log = l
		return nil
	}
}

// WithEventHook sets a function called with every valid event of a
// followed service before it is applied, for metrics such as the
// propagation lag (time.Since(e.At)). It runs on the NATS delivery
// goroutine: it must be quick and must not block.
func WithEventHook(f func(events.Event)) Option {
	return func(o *options) error {
		if f == nil {
			return optionError("WithEventHook: nil function")
		}
		o.onEvent = f
		return nil
	}
}

// ListObserver is called after each change of a service's server list,
// with the list before and after it (the balancer's copies: read them, do
// not keep or modify them past the call). Changes of one service arrive one
// at a time and in order; those of different services may arrive
// concurrently. It runs on the goroutine that applies the change, so it
// must be quick and must not block: hand the work to another goroutine.
type ListObserver func(service string, old, new []*balancer.Server)

// WithListObserver sets a function told of every list change (see
// ListObserver), for dashboards and audit trails. Default: none.
func WithListObserver(f ListObserver) Option {
	return func(o *options) error {
		if f == nil {
			return optionError("WithListObserver: nil observer")
		}
		o.onList = f
		return nil
	}
}

// WithTransportOptions passes options to the Transport (lbhttp.WithObserver
// for metrics, lbhttp.WithTransportTemplate for TLS and pools,
// lbhttp.WithRetryOnStatus).
func WithTransportOptions(opts ...lbhttp.Option) Option {
	return func(o *options) error {
		o.transport = append(o.transport, opts...)
		return nil
	}
}

// WithProxyOptions passes options to the Handler's reverse proxy
// (lbhttp.WithRoutes, lbhttp.WithoutDefaultRoute, lbhttp.WithHints,
// lbhttp.WithPreserveHost).
func WithProxyOptions(opts ...lbhttp.ProxyOption) Option {
	return func(o *options) error {
		o.proxy = append(o.proxy, opts...)
		return nil
	}
}

// newOptions resolves cfg and applies opts, joining every problem into one
// error.
func newOptions(cfg Config, opts []Option) (options, error) {
	var errs []error
	o := options{log: zerolog.Nop()}
	var err error
	if o.Config, err = cfg.resolve(); err != nil {
		errs = append(errs, err)
	}
	for i, opt := range opts {
		if opt == nil {
			errs = append(errs, optionError("option %d is nil", i))
			continue
		}
		if err := opt(&o); err != nil {
			errs = append(errs, err)
		}
	}
	return o, errors.Join(errs...)
}
