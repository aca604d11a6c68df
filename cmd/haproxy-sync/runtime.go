package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// runtimeAPI sends commands to HAProxy's Runtime API (its stats socket, or
// the master CLI of a master-worker HAProxy), one connection per command:
// HAProxy answers a command sent without "prompt" and closes the
// connection, so nothing is left half-read when HAProxy restarts, and a
// restart shows as a refused connection, then as a new process ID (see
// processID). Safe for concurrent use: it holds no connection.
type runtimeAPI struct {
	network, addr string
	// target prefixes every command: "" on a stats socket, "@1 " on the
	// master CLI (the current worker, the new one after a reload). The
	// master CLI keeps the connection open after a worker's answer: a
	// "quit" to the master follows the command.
	target string
	// timeout bounds one command, connection included, when ctx has no
	// earlier deadline.
	timeout time.Duration
}

// maxReply bounds a reply read into memory (show stat of a large backend
// is a few hundred bytes a server).
const maxReply = 16 << 20

// parseSocket reads the -socket flag: "unix:PATH", "tcp:HOST:PORT", a path
// (with a '/'), or HOST:PORT.
func parseSocket(s string) (network, addr string, err error) {
	switch {
	case s == "":
		return "", "", errors.New("empty socket address")
	case strings.HasPrefix(s, "unix:"):
		return "unix", strings.TrimPrefix(s, "unix:"), nil
	case strings.HasPrefix(s, "tcp:"):
		s = strings.TrimPrefix(s, "tcp:")
	case strings.Contains(s, "/"):
		return "unix", s, nil
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		return "", "", fmt.Errorf("socket %q is neither a path nor host:port: %w", s, err)
	}
	return "tcp", s, nil
}

// String names the socket in logs and errors.
func (r *runtimeAPI) String() string { return r.network + ":" + r.addr }

// do sends one command and returns HAProxy's whole reply. Errors wrap
// ErrSocket when the socket cannot be reached or the exchange breaks.
func (r *runtimeAPI) do(ctx context.Context, cmd string) (string, error) {
	if r.timeout > 0 {
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > r.timeout {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, r.timeout)
			defer cancel()
		}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, r.network, r.addr)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrSocket, r, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	line := cmd + "\n"
	if r.target != "" {
		line = r.target + cmd + ";quit\n"
	}
	if _, err := io.WriteString(conn, line); err != nil {
		return "", fmt.Errorf("%w: %s: sending %q: %w", ErrSocket, r, firstWord(cmd), err)
	}
	reply, err := io.ReadAll(io.LimitReader(conn, maxReply))
	if err != nil {
		return "", fmt.Errorf("%w: %s: reading the reply to %q: %w", ErrSocket, r, firstWord(cmd), err)
	}
	return string(reply), nil
}

// exec sends a command that changes HAProxy's state. HAProxy answers such
// commands with nothing when they succeed, or with a message that starts
// with one of ok; any other reply is a refusal, a *CommandError.
func (r *runtimeAPI) exec(ctx context.Context, cmd string, ok ...string) error {
	reply, err := r.do(ctx, cmd)
	if err != nil {
		return err
	}
	msg := strings.TrimSpace(reply)
	if msg == "" {
		return nil
	}
	for _, p := range ok {
		if strings.HasPrefix(msg, p) {
			return nil
		}
	}
	return &CommandError{Command: cmd, Reply: msg}
}

// firstWords returns the command's verb for error messages, without its
// arguments (which a log line carries in fields of its own).
func firstWord(cmd string) string {
	f := strings.Fields(cmd)
	if len(f) > 2 {
		f = f[:2]
	}
	return strings.Join(f, " ")
}

// Admin state bits of "show servers state" (HAProxy's SRV_ADMF_*).
const (
	adminForcedMaint = 0x01
	adminInherMaint  = 0x02
	adminConfigMaint = 0x04
	adminForcedDrain = 0x08
	adminInherDrain  = 0x10
	adminResolvMaint = 0x20
	adminHealthMaint = 0x40
	adminMaint       = adminForcedMaint | adminInherMaint | adminConfigMaint | adminResolvMaint | adminHealthMaint
)

// haServer is one server of a backend as HAProxy reports it.
type haServer struct {
	Name   string
	Addr   string // IP address; "-" when it has none (an unresolved name)
	Port   int
	Admin  int // admin state bits (admin*)
	Weight int // the user weight, 0 to 256
	// From "show stat": whether it is a backup, and its connections.
	Backup bool
	// From "show servers state": whether it connects with TLS.
	SSL                bool
	Status             string // UP, DOWN, MAINT, DRAIN, "no check"...
	Sessions           int    // current sessions (scur)
	UsedConns, IdleCon int
}

func (s haServer) maint() bool    { return s.Admin&adminMaint != 0 }
func (s haServer) draining() bool { return s.Admin&(adminForcedDrain|adminInherDrain) != 0 }

// backendServers reads a backend's servers: "show servers state" for the
// address, port, admin state and weight, then "show stat" for the backup
// flag and the connections. Errors wrap ErrUnknownBackend when HAProxy has
// no such backend.
func (r *runtimeAPI) backendServers(ctx context.Context, backend string) (map[string]*haServer, error) {
	reply, err := r.do(ctx, "show servers state "+backend)
	if err != nil {
		return nil, err
	}
	servers, err := parseServersState(reply, backend)
	if err != nil {
		return nil, err
	}
	if err := r.readStats(ctx, backend, servers); err != nil {
		return nil, err
	}
	return servers, nil
}

// readStats fills the fields "show stat" has of servers already in
// servers; a server "show stat" lists that servers lacks (added between the
// two commands) is left for the next read.
func (r *runtimeAPI) readStats(ctx context.Context, backend string, servers map[string]*haServer) error {
	rows, err := r.stats(ctx, backend, 4)
	if err != nil {
		return err
	}
	for _, row := range rows {
		s := servers[row["svname"]]
		if s == nil {
			continue
		}
		s.Backup = row["bck"] == "1"
		s.Status = row["status"]
		s.Sessions, _ = strconv.Atoi(row["scur"])
		s.UsedConns, _ = strconv.Atoi(row["used_conn_cur"])
		s.IdleCon, _ = strconv.Atoi(row["idle_conn_cur"])
	}
	return nil
}

// stats returns the rows of "show stat <backend> <type> -1" (type 2: the
// backend itself, 4: its servers) as maps from column name to value.
func (r *runtimeAPI) stats(ctx context.Context, backend string, typ int) ([]map[string]string, error) {
	reply, err := r.do(ctx, fmt.Sprintf("show stat %s %d -1", backend, typ))
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(reply, "# ") {
		return nil, replyError("show stat", backend, reply)
	}
	sc := bufio.NewScanner(strings.NewReader(reply))
	sc.Buffer(make([]byte, 64<<10), maxReply)
	var header []string
	var rows []map[string]string
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if header == nil {
			header = strings.Split(strings.TrimPrefix(line, "# "), ",")
			continue
		}
		row := map[string]string{}
		for i, v := range strings.Split(line, ",") {
			if i < len(header) {
				row[header[i]] = v
			}
		}
		if row["pxname"] == backend {
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// parseServersState reads the reply of "show servers state <backend>":
// a version line ("1"), a header, then one line per server.
func parseServersState(reply, backend string) (map[string]*haServer, error) {
	lines := strings.Split(reply, "\n")
	if len(lines) < 2 || strings.TrimSpace(lines[0]) != "1" || !strings.HasPrefix(lines[1], "# ") {
		return nil, replyError("show servers state", backend, reply)
	}
	col := map[string]int{}
	for i, name := range strings.Fields(strings.TrimPrefix(lines[1], "# ")) {
		col[name] = i
	}
	for _, need := range []string{"be_name", "srv_name", "srv_addr", "srv_admin_state", "srv_uweight", "srv_port"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("%w: show servers state: no column %s", ErrReply, need)
		}
	}
	servers := map[string]*haServer{}
	for _, line := range lines[2:] {
		f := strings.Fields(line)
		if len(f) < len(col) || f[col["be_name"]] != backend {
			continue
		}
		s := &haServer{Name: f[col["srv_name"]], Addr: f[col["srv_addr"]]}
		s.Port, _ = strconv.Atoi(f[col["srv_port"]])
		s.Admin, _ = strconv.Atoi(f[col["srv_admin_state"]])
		s.Weight, _ = strconv.Atoi(f[col["srv_uweight"]])
		if i, ok := col["srv_use_ssl"]; ok {
			s.SSL = f[i] == "1"
		}
		servers[s.Name] = s
	}
	return servers, nil
}

// replyError reads a reply that is not the table asked for: HAProxy's
// answer for an unknown backend wraps ErrUnknownBackend, any other
// ErrReply.
func replyError(cmd, backend, reply string) error {
	msg := strings.TrimSpace(reply)
	if strings.Contains(msg, "Can't find backend") || strings.Contains(msg, "No such backend") ||
		strings.Contains(msg, "No such proxy") {
		return fmt.Errorf("%w: %q (HAProxy: %s)", ErrUnknownBackend, backend, msg)
	}
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return fmt.Errorf("%w: %s %s: %q", ErrReply, cmd, backend, msg)
}

// processInfo is what "show info" tells of the process that answers.
type processInfo struct {
	PID     int
	Version string
	Uptime  int // seconds
}

// processInfo reads the answering process's ID and uptime: a new ID is a
// restarted or reloaded HAProxy, whose dynamic servers are gone.
func (r *runtimeAPI) processInfo(ctx context.Context) (processInfo, error) {
	reply, err := r.do(ctx, "show info")
	if err != nil {
		return processInfo{}, err
	}
	var p processInfo
	for _, line := range strings.Split(reply, "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		switch k {
		case "Pid":
			p.PID, _ = strconv.Atoi(v)
		case "Version":
			p.Version = v
		case "Uptime_sec":
			p.Uptime, _ = strconv.Atoi(v)
		}
	}
	if p.PID == 0 {
		return p, replyError("show info", "", reply)
	}
	return p, nil
}
