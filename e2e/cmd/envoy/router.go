package main

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy/record"
)

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
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = r.rec.Write(record.Event{Kind: record.Proxy, Name: r.spec.name, Cluster: cluster,
		Method: req.Method, Path: req.URL.Path, Query: req.URL.RawQuery, Remote: req.RemoteAddr, Status: w.status})
}
