package supervisor

import (
	"context"
	"net"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestPostEndlessStatusLine: whatever listens at the action's address (any
// container of the pod shares its network namespace, and can bind the port
// before the sidecar does or after it exits) may answer with a status line
// that never ends. Post must give up after a few hundred bytes, not read
// until the timeout: it read 739 MB in 2s on loopback, far past the pod's
// memory limit (found by the hardening work, issue 9).
func TestPostEndlessStatusLine(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	chunk := []byte(strings.Repeat("A", 64<<10))
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("HTTP/1.1 200 "))
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	u, _ := url.Parse("http://" + l.Addr().String() + "/quitquitquit")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	code, err := Post(context.Background(), u, 2*time.Second)
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	if err == nil || code != 0 {
		t.Fatalf("Post = %d, %v; want an error", code, err)
	}
	if elapsed > time.Second {
		t.Errorf("Post took %s: it read until the timeout", elapsed)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Errorf("Post allocated %d bytes reading one status line", grew)
	}
}
