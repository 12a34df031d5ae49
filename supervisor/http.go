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
	"syscall"
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

// postBefore POSTs u ahead of s's quit (beforeQuit) and awaits its answer:
// tried again every ScanInterval while nothing answers (nothing listens
// yet, or pilot-agent drops a /drain that comes before its envoy agent is
// made), for at most HTTPTimeout. Whatever its outcome, the quit follows:
// a missing step costs the drain, not the stop.
func (r *run) postBefore(ctx context.Context, u *url.URL, s *sidecar) {
	deadline := time.Now().Add(r.cfg.HTTPTimeout)
	for {
		code, err := r.post(ctx, u, time.Until(deadline))
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && code >= 200 && code <= 299:
			r.log.Info().Str("url", u.Redacted()).Int("status", code).Str("container", s.container).
				Msg("sidecar drained ahead of its quit")
			return
		case err == nil && code == 404:
			// pilot-agent before 1.21.
			r.log.Info().Str("url", u.Redacted()).Int("status", code).Str("container", s.container).
				Msg("sidecar has no drain endpoint: its quit will drain first")
			return
		case err == nil:
			r.log.Warn().Str("url", u.Redacted()).Int("status", code).Str("container", s.container).
				Msg("drain ahead of the quit refused: quitting anyway")
			return
		case s.exited() || time.Until(deadline) <= 0:
			r.log.Warn().Str("url", u.Redacted()).Err(err).Str("container", s.container).
				Msg("no answer ahead of the quit: quitting anyway")
			return
		}
		t := time.NewTimer(min(r.cfg.ScanInterval, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// exitsWithin reports whether s exits within d.
func (r *run) exitsWithin(ctx context.Context, s *sidecar, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.proc.Done():
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// lostAnswerWait is how long a sidecar that got the POST but closed the
// connection without an answer is given to exit before it is sent again.
const lostAnswerWait = time.Second

// postUntilAnswered POSTs an HTTP action until it is answered or s exits,
// for at most HTTPTimeout from the first try. stopped means s exited
// meanwhile: the action worked, whatever the answer. Two failures are
// tried again: a refused connection (nothing listens yet: a sidecar still
// starting), every ScanInterval; and a request that reached the sidecar
// and got no answer (the connection closed or reset), once the sidecar is
// still up lostAnswerWait later. pilot-agent's and cloud-sql-proxy's quit
// can exit before their 200 is flushed (then s exits, and that is the
// stop), but pilot-agent also drops a /quitquitquit that comes in the
// first ~100 ms after its status port opens (its handler panics on an
// agent not yet made, the connection closes, and it runs on; seen on the
// e2e cluster with apps of milliseconds): asked again, it quits. The stop
// endpoints are idempotent. A sidecar that got a request and is still up
// at the bound is given HTTPTimeout more to exit before the caller falls
// back.
func (r *run) postUntilAnswered(ctx context.Context, u *url.URL, s *sidecar) (code int, stopped bool, err error) {
	deadline := time.Now().Add(r.cfg.HTTPTimeout)
	reached, logged := false, map[bool]bool{}
	for {
		code, err = r.post(ctx, u, time.Until(deadline))
		if err == nil || ctx.Err() != nil {
			return code, false, err
		}
		refused := errors.Is(err, syscall.ECONNREFUSED)
		wait := min(r.cfg.ScanInterval, time.Until(deadline))
		if !refused {
			reached = true
			if r.exitsWithin(ctx, s, min(lostAnswerWait, time.Until(deadline))) {
				return 0, true, nil
			}
			wait = 0
		}
		if s.exited() {
			return 0, true, nil
		}
		if ctx.Err() != nil || time.Until(deadline) <= 0 {
			break
		}
		if !logged[refused] {
			logged[refused] = true
			ev := r.log.Info().Str("url", u.Redacted()).Err(err).Str("timeout", r.cfg.HTTPTimeout.String())
			if refused {
				ev.Msg("http action not answered yet: trying again until it is")
			} else {
				ev.Msg("http action got no answer and the sidecar runs on: sending it again")
			}
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return 0, false, ctx.Err()
			case <-t.C:
			}
		}
	}
	if ctx.Err() == nil && reached && r.exitsWithin(ctx, s, r.cfg.HTTPTimeout) {
		return 0, true, nil
	}
	return code, false, err
}
