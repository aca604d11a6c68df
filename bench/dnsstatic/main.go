// Command dnsstatic serves a static DNS zone for bench/dns.sh, the yardstick
// of the pushlb responder: one name, orders.service.pushlb., whose A
// answer holds n records of 127.0.0.1 (the addresses of the fleet that
// dns.sh announces to the gateway).
//
//	dnsstatic -addr 127.0.0.1:19601 -mode trivial -n 10
//
// -mode trivial answers from a handler of github.com/miekg/dns that
// returns the same prepared records every time (the library's floor);
// -mode static answers through pushlb's dns package over a fixed list
// (dns.Static): the responder's own code without a pushed list. It prints
// "ready" once it listens and stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	mdns "github.com/miekg/dns"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/dns"
)

const name = "orders.service.pushlb."

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dnsstatic:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:19601", "UDP and TCP `address`")
	mode := flag.String("mode", "trivial", "trivial (a miekg/dns handler) or static (pushlb's responder over a fixed list)")
	n := flag.Int("n", 10, "records in the answer")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch *mode {
	case "trivial":
		return trivial(ctx, *addr, *n)
	case "static":
		list := make([]balancer.Server, *n)
		for i := range list {
			list[i] = balancer.Server{ID: fmt.Sprint(i), Host: "127.0.0.1", Port: 20000 + i}
		}
		s, err := dns.New(dns.NewStatic(map[string][]balancer.Server{"orders": list}), dns.Config{Addr: *addr})
		if err != nil {
			return err
		}
		if err := s.Start(ctx); err != nil {
			return err
		}
		fmt.Println("ready")
		<-ctx.Done()
		return s.Close(context.Background())
	}
	return fmt.Errorf("unknown -mode %q", *mode)
}

// trivial serves name's n A records from a handler that copies prepared
// records into each reply.
func trivial(ctx context.Context, addr string, n int) error {
	answer := make([]mdns.RR, n)
	for i := range answer {
		answer[i] = &mdns.A{Hdr: mdns.RR_Header{Name: name, Rrtype: mdns.TypeA, Class: mdns.ClassINET}, A: net.IPv4(127, 0, 0, 1)}
	}
	h := mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		if len(r.Question) == 1 && r.Question[0].Name == name && r.Question[0].Qtype == mdns.TypeA {
			m.Answer = answer
		} else {
			m.Rcode = mdns.RcodeNameError
		}
		w.WriteMsg(m)
	})
	udp := &mdns.Server{Addr: addr, Net: "udp", Handler: h}
	tcp := &mdns.Server{Addr: addr, Net: "tcp", Handler: h}
	errs := make(chan error, 2)
	for _, s := range []*mdns.Server{udp, tcp} {
		go func() { errs <- s.ListenAndServe() }()
	}
	fmt.Println("ready")
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
	}
	udp.Shutdown()
	tcp.Shutdown()
	return nil
}
