package main

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy/record"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    options
		wantErr string
	}{{
		// What pilot-agent (pkg/envoy/proxy.go) passes for a sidecar.
		name: "pilot-agent sidecar",
		args: strings.Fields("-c etc/istio/proxy/envoy-rev.json --drain-time-s 45 --drain-strategy immediate " +
			"--local-address-ip-version v4 --file-flush-interval-msec 1000 --disable-hot-restart " +
			"--allow-unknown-static-fields -l warning --component-log-level misc:error --skip-deprecated-logs --concurrency 2"),
		want: options{configPath: "etc/istio/proxy/envoy-rev.json", drainTime: 45 * time.Second, concurrency: 2},
	}, {
		name: "equals form",
		args: []string{"--config-path=/b.json", "--drain-time-s=5"},
		want: options{configPath: "/b.json", drainTime: 5 * time.Second},
	}, {
		name:    "unknown flag is refused like envoy does",
		args:    []string{"-c", "b.json", "--no-such-flag", "x"},
		wantErr: "unknown flag",
	}, {
		name:    "no config",
		args:    []string{"--drain-time-s", "5"},
		wantErr: "--config-path",
	}, {
		name:    "missing value",
		args:    []string{"-c"},
		wantErr: "needs a value",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseArgs(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseArgs(%q) error = %v, want one containing %q", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseArgs(%q): %v", tt.args, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parseArgs(%q)\n got %+v\nwant %+v", tt.args, got, tt.want)
			}
		})
	}
}

func TestLoadBootstrap(t *testing.T) {
	got, err := loadBootstrap("testdata/bootstrap.json")
	if err != nil {
		t.Fatal(err)
	}
	want := bootstrap{
		adminAddr: "127.0.0.1:15000",
		listeners: []listenerSpec{{
			name: "0.0.0.0_15021",
			addr: "0.0.0.0:15021",
			routes: []routeSpec{
				{prefix: "/healthz/ready", cluster: "agent", target: "127.0.0.1:15020"},
				// A pipe endpoint is no HTTP target: the route answers 503.
				{prefix: "/xds", exact: true, cluster: "xds-grpc"},
			},
		}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("loadBootstrap\n got %+v\nwant %+v", got, want)
	}
}

func TestStatsText(t *testing.T) {
	s := &server{start: time.Now(), listeners: []string{"0.0.0.0_15021"}}
	// The readiness regex pilot-agent sends (pilot/cmd/pilot-agent/status/util/stats.go).
	const filter = `^(server\.state|listener_manager\.workers_started)`
	got, err := statsText(s.stats(), filter)
	if err != nil {
		t.Fatal(err)
	}
	if want := "listener_manager.workers_started: 0\nserver.state: 2\n"; got != want {
		t.Errorf("before ready: got %q, want %q", got, want)
	}
	s.ready = true
	got, _ = statsText(s.stats(), filter)
	if want := "listener_manager.workers_started: 1\nserver.state: 0\n"; got != want {
		t.Errorf("after ready: got %q, want %q", got, want)
	}
	if _, err := statsText(s.stats(), "("); err == nil {
		t.Errorf("invalid regex accepted")
	}
}

func TestAdminHandler(t *testing.T) {
	dir := t.TempDir()
	rec, err := record.Create(filepath.Join(dir, "rec.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var drained []url.Values
	quits := 0
	h := &adminHandler{
		srv:   &server{start: time.Now(), ready: true},
		rec:   rec,
		drain: func(q url.Values) { drained = append(drained, q) },
		quit:  func() { quits++ },
	}
	do := func(method, target string) int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, target, nil))
		return w.Code
	}
	for _, tt := range []struct {
		method, target string
		want           int
	}{
		{http.MethodGet, "/drain_listeners?inboundonly&graceful", http.StatusMethodNotAllowed},
		{http.MethodPost, "/drain_listeners?inboundonly&graceful", http.StatusOK},
		{http.MethodGet, "/ready", http.StatusOK},
		{http.MethodGet, "/no/such/endpoint", http.StatusNotFound},
		{http.MethodPost, "/quitquitquit", http.StatusOK},
	} {
		if got := do(tt.method, tt.target); got != tt.want {
			t.Errorf("%s %s = %d, want %d", tt.method, tt.target, got, tt.want)
		}
	}
	if len(drained) != 1 || !has(drained[0], "inboundonly") || !has(drained[0], "graceful") || has(drained[0], "skip_exit") {
		t.Errorf("drain calls %v, want one with inboundonly and graceful", drained)
	}
	if quits != 1 {
		t.Errorf("quit called %d times, want 1", quits)
	}
	events, err := record.Read(filepath.Join(dir, "rec.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(record.OfKind(events, record.Admin)); got != 5 {
		t.Errorf("recorded %d admin requests, want 5:\n%s", got, record.Format(events))
	}
}
