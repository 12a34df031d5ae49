package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
)

// bootstrap is what the stand-in takes from envoy's bootstrap config: where
// the admin API listens, and the static HTTP listeners whose routes point at
// static clusters. pilot-agent's bootstrap has two that matter: 0.0.0.0:15021
// routes /healthz/ready to pilot-agent's :15020 (the pod's readiness probe
// goes through envoy), and 0.0.0.0:15090 routes /stats/prometheus to the
// admin port.
type bootstrap struct {
	adminAddr string
	listeners []listenerSpec
}

type listenerSpec struct {
	name   string
	addr   string
	routes []routeSpec
}

type routeSpec struct {
	prefix  string // match.prefix, or match.path for an exact match
	exact   bool
	cluster string
	target  string // host:port of the cluster's first endpoint; "" when not static TCP
}

// The subset of envoy's v3 bootstrap JSON that we read. Unknown fields are
// ignored, which is what envoy's --allow-unknown-static-fields does too.
type socketAddress struct {
	Address   string          `json:"address"`
	PortValue json.RawMessage `json:"port_value"`
}

type address struct {
	SocketAddress *socketAddress `json:"socket_address"`
}

type bootstrapJSON struct {
	Admin struct {
		Address address `json:"address"`
	} `json:"admin"`
	StaticResources struct {
		Listeners []struct {
			Name         string  `json:"name"`
			Address      address `json:"address"`
			FilterChains []struct {
				Filters []struct {
					Name        string `json:"name"`
					TypedConfig struct {
						RouteConfig struct {
							VirtualHosts []struct {
								Routes []struct {
									Match struct {
										Prefix *string `json:"prefix"`
										Path   *string `json:"path"`
									} `json:"match"`
									Route struct {
										Cluster string `json:"cluster"`
									} `json:"route"`
								} `json:"routes"`
							} `json:"virtual_hosts"`
						} `json:"route_config"`
					} `json:"typed_config"`
				} `json:"filters"`
			} `json:"filter_chains"`
		} `json:"listeners"`
		Clusters []struct {
			Name           string `json:"name"`
			LoadAssignment struct {
				Endpoints []struct {
					LbEndpoints []struct {
						Endpoint struct {
							Address address `json:"address"`
						} `json:"endpoint"`
					} `json:"lb_endpoints"`
				} `json:"endpoints"`
			} `json:"load_assignment"`
		} `json:"clusters"`
	} `json:"static_resources"`
}

const httpConnectionManager = "envoy.filters.network.http_connection_manager"

func (s *socketAddress) hostPort() (string, error) {
	if s == nil {
		return "", fmt.Errorf("no socket_address")
	}
	// port_value is a number in pilot-agent's template; protobuf JSON also allows a string.
	var port int
	if err := json.Unmarshal(s.PortValue, &port); err != nil {
		var ps string
		if err2 := json.Unmarshal(s.PortValue, &ps); err2 != nil {
			return "", fmt.Errorf("port_value %s: %w", s.PortValue, err)
		}
		if port, err = strconv.Atoi(ps); err != nil {
			return "", fmt.Errorf("port_value %q: %w", ps, err)
		}
	}
	return net.JoinHostPort(s.Address, strconv.Itoa(port)), nil
}

// loadBootstrap reads the bootstrap file at path (JSON, as pilot-agent writes it).
func loadBootstrap(path string) (bootstrap, error) {
	var b bootstrap
	raw, err := os.ReadFile(path)
	if err != nil {
		return b, err
	}
	var j bootstrapJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return b, fmt.Errorf("parse %s (the stand-in reads JSON bootstraps only): %w", path, err)
	}
	if b.adminAddr, err = j.Admin.Address.SocketAddress.hostPort(); err != nil {
		return b, fmt.Errorf("admin address: %w", err)
	}
	clusters := map[string]string{}
	for _, c := range j.StaticResources.Clusters {
		for _, e := range c.LoadAssignment.Endpoints {
			for _, lb := range e.LbEndpoints {
				// Pipe (unix socket) endpoints such as xds-grpc are not HTTP targets for us.
				if hp, err := lb.Endpoint.Address.SocketAddress.hostPort(); err == nil && clusters[c.Name] == "" {
					clusters[c.Name] = hp
				}
			}
		}
	}
	for _, l := range j.StaticResources.Listeners {
		hp, err := l.Address.SocketAddress.hostPort()
		if err != nil {
			return b, fmt.Errorf("listener %s: %w", l.Name, err)
		}
		ls := listenerSpec{name: l.Name, addr: hp}
		for _, fc := range l.FilterChains {
			for _, f := range fc.Filters {
				if f.Name != httpConnectionManager {
					continue
				}
				for _, vh := range f.TypedConfig.RouteConfig.VirtualHosts {
					for _, r := range vh.Routes {
						rs := routeSpec{cluster: r.Route.Cluster, target: clusters[r.Route.Cluster]}
						switch {
						case r.Match.Prefix != nil:
							rs.prefix = *r.Match.Prefix
						case r.Match.Path != nil:
							rs.prefix, rs.exact = *r.Match.Path, true
						default:
							continue
						}
						ls.routes = append(ls.routes, rs)
					}
				}
			}
		}
		// A listener without HTTP routes (e.g. a TLS-only one) is not served:
		// the stand-in terminates no TLS.
		if len(ls.routes) > 0 {
			b.listeners = append(b.listeners, ls)
		}
	}
	return b, nil
}
