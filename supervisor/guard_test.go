package supervisor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// TestGuard: seed 20261210, Job 126. containerd, restarted as istio-proxy
// exited after the supervisor's SIGTERM, lost its exit (255, "Unknown"),
// and the kubelet started istio-proxy again under OnFailure: the Job hung.
// A native supervisor, idle until the kubelet stops it, stops such a
// sidecar again, maxStopRounds times at most; under Never (no restart
// comes) it only waits.
func TestGuard(t *testing.T) {
	for _, policy := range []string{"OnFailure", "Never"} {
		t.Run(policy, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY="+policy)
				h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
				h.proc(10).exit(exited(0))
				res := h.finish(Success, "SIGTERM 100")
				h.pod.remove("pilot-agent")
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					New(cfg, zerolog.New(h.logw), h.pod, h.kernel, nil).Guard(ctx, res)
					close(done)
				}()
				want := []string{"SIGTERM 100"}
				for round := 1; round <= maxStopRounds+1; round++ {
					pid := 100 + round
					h.pod.add(container(procscan.Sidecar, "pilot-agent", pid)) // the kubelet's restart
					time.Sleep(10 * cfg.ScanInterval)
					synctest.Wait()
					if policy == "OnFailure" && round <= maxStopRounds {
						want = append(want, fmt.Sprintf("SIGTERM %d", pid))
					}
					if got := h.kernel.sent(); !slices.Equal(got, want) {
						t.Fatalf("round %d: signals %q, want %q; log:\n%s", round, got, want, h.logged())
					}
					h.pod.remove("pilot-agent")
				}
				if again := strings.Count(h.logged(), "runs again after the stop"); policy == "OnFailure" && again != maxStopRounds || policy == "Never" && again != 0 {
					t.Errorf("%d sidecars said to run again; log:\n%s", again, h.logged())
				}
				select {
				case <-done:
					t.Fatal("Guard returned before the kubelet's SIGTERM")
				default:
				}
				cancel()
				<-done
			})
		})
	}
}
