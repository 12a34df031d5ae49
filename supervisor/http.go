package supervisor

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Post sends an empty POST to u and returns the response's status code. It
// speaks just enough HTTP/1.1 for an action such as pilot-agent's
// /quitquitquit: the request, then the status line. net/http would add a
// fifth to the binary for nothing this needs, and would honour HTTP_PROXY,
// which a loopback call to the sidecar must never go through.
func Post(ctx context.Context, u *url.URL, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	host := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			host = net.JoinHostPort(u.Hostname(), "443")
		} else {
			host = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	// A cancelled context (pod deletion) must not wait for the deadline.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if u.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: u.Hostname()})
		if err := tc.HandshakeContext(ctx); err != nil {
			return 0, fmt.Errorf("tls: %w", err)
		}
		conn = tc
	}
	path := u.RequestURI()
	req := "POST " + path + " HTTP/1.1\r\n" +
		"Host: " + u.Host + "\r\n" +
		"User-Agent: sidecar-supervisor\r\n" +
		"Content-Length: 0\r\n" +
		"Connection: close\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(io.LimitReader(conn, 512)).ReadString('\n') // a status line is short; whoever answers may not be
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return 0, ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return 0, fmt.Errorf("no answer within %s", timeout)
	case err != nil:
		return 0, fmt.Errorf("read status line: %w", err)
	}
	// "HTTP/1.1 200 OK"
	proto, rest, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
	codeStr, _, _ := strings.Cut(rest, " ")
	code, err := strconv.Atoi(codeStr)
	if !strings.HasPrefix(proto, "HTTP/1.") || err != nil || code < 100 || code > 999 {
		return 0, fmt.Errorf("not an HTTP response: %q", line)
	}
	return code, nil
}
