package pushlb

import (
	"errors"

	"github.com/rs/zerolog"

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

// WithListObserver sets a function told of every list change with its
// causes (see ListObserver), for dashboards and audit trails: the one way
// to hear about list changes. Default: none.
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
