package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy/record"
)

// statusWriter remembers the status code a handler sent, for the record.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = cmp.Or(w.status, code)
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.status = cmp.Or(w.status, http.StatusOK)
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush on the real writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// adminHandler serves the admin API endpoints that pilot-agent (and people
// debugging a pod) use, and records every request, known or not.
type adminHandler struct {
	srv   *server
	rec   *record.Writer
	drain func(q url.Values)
	quit  func()
}

// has reports whether a query has key, with or without a value:
// pilot-agent sends "?inboundonly&graceful", flags with no "=".
func has(q url.Values, key string) bool {
	_, ok := q[key]
	return ok
}

func (h *adminHandler) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	w := &statusWriter{ResponseWriter: rw}
	h.serve(w, r)
	w.status = cmp.Or(w.status, http.StatusOK)
	_ = h.rec.Write(record.Event{
		Kind: record.Admin, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
		Remote: r.RemoteAddr, Status: w.status,
	})
	if r.URL.Path == "/quitquitquit" && r.Method == http.MethodPost {
		// The answer must reach the caller before we go: flush, then exit
		// from the main goroutine (which also records the exit).
		_ = http.NewResponseController(rw).Flush()
		h.quit()
	}
}

// postOnly are the mutating admin endpoints: they refuse GET, as envoy's
// do, and answer OK.
var postOnly = map[string]bool{"/drain_listeners": true, "/healthcheck/fail": true, "/healthcheck/ok": true,
	"/quitquitquit": true, "/logging": true, "/reset_counters": true, "/reopen_logs": true}

func (h *adminHandler) serve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if postOnly[r.URL.Path] {
		if r.Method != http.MethodPost {
			http.Error(w, "This endpoint requires POST", http.StatusMethodNotAllowed)
			return
		}
		switch r.URL.Path {
		case "/drain_listeners":
			h.drain(q)
		case "/healthcheck/fail", "/healthcheck/ok":
			h.srv.mu.Lock()
			h.srv.healthFailed = r.URL.Path == "/healthcheck/fail"
			h.srv.mu.Unlock()
		}
		_, _ = w.Write([]byte("OK\n"))
		return
	}
	switch r.URL.Path {
	case "/stats":
		if has(q, "format") && q.Get("format") == "prometheus" {
			w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
			_, _ = w.Write([]byte(statsPrometheus(h.srv.stats())))
			return
		}
		body, err := statsText(h.srv.stats(), q.Get("filter"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
		_, _ = w.Write([]byte(body))
	case "/stats/prometheus":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(statsPrometheus(h.srv.stats())))
	case "/ready":
		state := h.srv.stateName()
		if state != "LIVE" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write([]byte(state + "\n"))
	case "/server_info":
		writeJSON(w, map[string]any{
			"version": "envoy-standin (sidecar-supervisor e2e)",
			"state":   h.srv.stateName(),
			"command_line_options": map[string]any{
				"concurrency": h.srv.concurrency,
				"drain_time":  fmt.Sprintf("%ds", int(h.srv.drainTime.Seconds())),
			},
		})
	case "/config_dump":
		writeJSON(w, map[string]any{"configs": []any{}})
	case "/listeners", "/clusters", "/certs", "/memory", "/runtime", "/hot_restart_version":
		writeJSON(w, map[string]any{})
	default:
		http.Error(w, "invalid path (envoy stand-in: not implemented)", http.StatusNotFound)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// router serves one bootstrap listener: the first route whose match fits the
// path forwards the request to its static cluster, as envoy's router would.
type router struct {
	spec    listenerSpec
	rec     *record.Writer
	proxies map[string]*httputil.ReverseProxy // by cluster
}

func newRouter(spec listenerSpec, rec *record.Writer) *router {
	r := &router{spec: spec, rec: rec, proxies: map[string]*httputil.ReverseProxy{}}
	for _, rt := range spec.routes {
		if rt.target == "" || r.proxies[rt.cluster] != nil {
			continue
		}
		target := &url.URL{Scheme: "http", Host: rt.target}
		p := httputil.NewSingleHostReverseProxy(target)
		// Envoy answers 503 when it cannot reach the upstream; pilot-agent's
		// readiness through :15021 therefore reads 503 until :15020 is up.
		p.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "upstream connect error or disconnect/reset before headers: "+err.Error(), http.StatusServiceUnavailable)
		}
		r.proxies[rt.cluster] = p
	}
	return r
}

func (r *router) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	w := &statusWriter{ResponseWriter: rw}
	cluster := ""
	for _, rt := range r.spec.routes {
		if (rt.exact && req.URL.Path == rt.prefix) || (!rt.exact && strings.HasPrefix(req.URL.Path, rt.prefix)) {
			cluster = rt.cluster
			break
		}
	}
	switch p := r.proxies[cluster]; {
	case cluster == "":
		http.NotFound(w, req)
	case p == nil:
		http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
	default:
		p.ServeHTTP(w, req)
	}
	w.status = cmp.Or(w.status, http.StatusOK)
	_ = r.rec.Write(record.Event{Kind: record.Proxy, Name: r.spec.name, Cluster: cluster,
		Method: req.Method, Path: req.URL.Path, Query: req.URL.RawQuery, Remote: req.RemoteAddr, Status: w.status})
}
