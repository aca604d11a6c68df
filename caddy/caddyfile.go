package pushlbcaddy

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// UnmarshalCaddyfile sets up the source from Caddyfile tokens:
//
//	dynamic pushlb [<service>] {
//		service         <service>          # instead of the argument; placeholders allowed
//		zone            <zone>
//		nats            <url...>           # repeatable; default nats://127.0.0.1:4222
//		creds           <file>
//		user            <name>
//		password        <password>
//		password_file   <file>
//		token           <token>
//		token_file      <file>
//		nkey            <seed file>
//		tls_ca          <file>
//		tls_cert        <file>
//		tls_key         <file>
//		connect_timeout <duration>
//		ping_interval   <duration>
//		prefix          <prefix>
//		lease           <duration>
//		reaper
//		rule            <rule>             # the services' default rule
//		balancers       <file>             # pushlb balancer config, YAML or .properties
//		gossip [<bind>] {
//			join     <host:port...>
//			profile  lan|fast
//			key_file <file>
//			label    <label>
//		}
//	}
func (u *Upstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the source's name
	args := d.RemainingArgs()
	switch len(args) {
	case 0:
	case 1:
		u.Service = args[0]
	default:
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		dir := d.Val()
		switch dir {
		case "service", "zone", "creds", "user", "password", "password_file", "token", "token_file", "nkey",
			"tls_ca", "tls_cert", "tls_key", "prefix", "rule", "balancers":
			if !d.NextArg() {
				return d.ArgErr()
			}
			v := d.Val()
			if d.NextArg() {
				return d.Errf("%s takes one value", dir)
			}
			target := map[string]*string{
				"service": &u.Service, "zone": &u.Zone, "creds": &u.CredsFile, "user": &u.User,
				"password": &u.Password, "password_file": &u.PasswordFile, "token": &u.Token,
				"token_file": &u.TokenFile, "nkey": &u.NkeyFile, "tls_ca": &u.TLSCA, "tls_cert": &u.TLSCert,
				"tls_key": &u.TLSKey, "prefix": &u.Prefix, "rule": &u.Rule, "balancers": &u.BalancersFile,
			}[dir]
			if *target != "" {
				return d.Errf("%s already specified", dir)
			}
			*target = v
		case "nats":
			urls := d.RemainingArgs()
			if len(urls) == 0 {
				return d.ArgErr()
			}
			u.NATS = append(u.NATS, urls...)
		case "connect_timeout", "ping_interval", "lease":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil {
				return d.Errf("%s: %v", dir, err)
			}
			if d.NextArg() {
				return d.Errf("%s takes one value", dir)
			}
			switch dir {
			case "lease":
				u.Lease = caddy.Duration(dur)
			case "ping_interval":
				u.PingInterval = caddy.Duration(dur)
			default:
				u.ConnectTimeout = caddy.Duration(dur)
			}
		case "reaper":
			if d.NextArg() {
				return d.ArgErr()
			}
			u.Reaper = true
		case "gossip":
			if u.Gossip != nil {
				return d.Err("gossip already specified")
			}
			g := &Gossip{}
			if d.NextArg() {
				g.Bind = d.Val()
			}
			if d.NextArg() {
				return d.ArgErr()
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				sub := d.Val()
				switch sub {
				case "join":
					peers := d.RemainingArgs()
					if len(peers) == 0 {
						return d.ArgErr()
					}
					g.Join = append(g.Join, peers...)
				case "bind", "profile", "key_file", "label":
					if !d.NextArg() {
						return d.ArgErr()
					}
					v := d.Val()
					if d.NextArg() {
						return d.Errf("gossip %s takes one value", sub)
					}
					*map[string]*string{"bind": &g.Bind, "profile": &g.Profile, "key_file": &g.KeyFile, "label": &g.Label}[sub] = v
				default:
					return d.Errf("unrecognized pushlb gossip subdirective %q", sub)
				}
			}
			u.Gossip = g
		default:
			return d.Errf("unrecognized pushlb subdirective %q", dir)
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens:
//
//	lb_policy pushlb {
//		rule        <rule>     # for pools not from the pushlb source
//		hash_header <name>     # or hash_cookie <name>, or hash_query <name>
//		hint_header <name>|-   # default X-Pushlb-Hint; - reads no hint
//	}
func (s *Selection) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the policy's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		dir := d.Val()
		target := map[string]*string{"rule": &s.Rule, "hash_header": &s.HashHeader, "hash_cookie": &s.HashCookie, "hash_query": &s.HashQuery, "hint_header": &s.HintHeader}[dir]
		if target == nil {
			return d.Errf("unrecognized pushlb policy subdirective %q", dir)
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		if *target != "" {
			return d.Errf("%s already specified", dir)
		}
		*target = d.Val()
		if d.NextArg() {
			return d.Errf("%s takes one value", dir)
		}
	}
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*Upstreams)(nil)
	_ caddyfile.Unmarshaler = (*Selection)(nil)
)
