package supervisor

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestPost(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+r.Host+" "+r.Header.Get("Content-Length"))
		mu.Unlock()
		switch r.URL.Path {
		case "/quitquitquit":
			w.Write([]byte("OK"))
		case "/teapot":
			w.WriteHeader(http.StatusTeapot)
		case "/slow":
			time.Sleep(time.Second)
		}
	}))
	defer srv.Close()
	tests := []struct {
		path    string
		code    int
		errPart string
	}{
		{"/quitquitquit", 200, ""},
		{"/quitquitquit?now=1", 200, ""},
		{"/teapot", 418, ""},
		{"/slow", 0, "no answer within 300ms"},
	}
	for _, tt := range tests {
		u, _ := url.Parse(srv.URL + tt.path)
		code, err := Post(context.Background(), u, 300*time.Millisecond)
		if code != tt.code || (tt.errPart == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.errPart)) {
			t.Errorf("Post %s = %d, %v; want %d, error containing %q", tt.path, code, err, tt.code, tt.errPart)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	host := strings.TrimPrefix(srv.URL, "http://")
	if want := "POST /quitquitquit " + host + " 0"; len(got) == 0 || got[0] != want {
		t.Errorf("server saw %q, want %q first", got, want)
	}
	if want := "POST /quitquitquit?now=1 " + host + " 0"; len(got) < 2 || got[1] != want {
		t.Errorf("server saw %q, want %q second", got, want)
	}
}

func TestPostErrors(t *testing.T) {
	// A port nobody listens on.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	u, _ := url.Parse("http://" + addr + "/quitquitquit")
	if _, err := Post(context.Background(), u, time.Second); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("closed port: %v, want connection refused", err)
	}

	// Not HTTP at all.
	l, _ = net.Listen("tcp", "127.0.0.1:0")
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Write([]byte("SSH-2.0-OpenSSH\r\n"))
			c.Close()
		}
	}()
	u, _ = url.Parse("http://" + l.Addr().String() + "/")
	if _, err := Post(context.Background(), u, time.Second); err == nil || !strings.Contains(err.Error(), "not an HTTP response") {
		t.Errorf("non-HTTP peer: %v", err)
	}

	// HTTPS with a certificate nobody trusts.
	tls := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer tls.Close()
	u, _ = url.Parse(tls.URL + "/quitquitquit")
	if _, err := Post(context.Background(), u, time.Second); err == nil || !strings.Contains(err.Error(), "tls") {
		t.Errorf("untrusted https: %v", err)
	}

	// A cancelled context (pod deletion) ends the request at once.
	hang, _ := net.Listen("tcp", "127.0.0.1:0")
	defer hang.Close()
	u, _ = url.Parse("http://" + hang.Addr().String() + "/")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	if _, err := Post(ctx, u, time.Minute); err == nil {
		t.Error("cancelled request succeeded")
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("cancelled request took %v", d)
	}
}

// TestPostRefused: a port nothing listens on is a refused connection, the
// one error postUntilAnswered tries again.
func TestPostRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	u, _ := url.Parse("http://" + addr + "/quitquitquit")
	if _, err := Post(context.Background(), u, time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Post to a closed port: %v, want ECONNREFUSED", err)
	}
}
