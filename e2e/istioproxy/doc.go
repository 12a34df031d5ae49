// Package istioproxy lays out an istio-proxy container for end-to-end tests:
// the real Istio pilot-agent, with the stand-in envoy (e2e/cmd/envoy) as its
// envoy, in a directory tree that becomes the container's working directory
// or root filesystem.
//
// # One tree, two backends
//
// pilot-agent resolves nearly every file it uses relative to its working
// directory: "./etc/istio/proxy" (bootstrap, XDS socket, gRPC bootstrap),
// "./var/run/secrets/istio/root-cert.pem", "./var/lib/istio/envoy/
// envoy_bootstrap_tmpl.json", "./var/run/secrets/workload-spiffe-uds/socket",
// "./etc/istio/pod/*", "./var/run/secrets/tokens/istio-token". In a real pod
// the working directory is "/" and those are the mounted volumes. Prepare
// therefore builds the tree with everything at the same relative places,
// including the binaries (./usr/local/bin/pilot-agent and ./usr/local/bin/envoy)
// and points pilot-agent at envoy with a relative binaryPath. Argv and Env are
// the same for both ways of running it; the only rule is:
//
//   - plain namespaces: run Argv with the working directory set to Root (its
//     own mount namespace over the host filesystem is fine; absolute paths
//     such as /etc/hosts then resolve on the host);
//   - runc: use Root as the container's rootfs and "/" as process.cwd.
//
// The few absolute paths involved: envoy's profile_path
// /var/lib/istio/data/envoy.prof (never written by the stand-in), /etc/hosts
// (pilot-agent calls envoy's admin API as "localhost:15000", so a runc rootfs
// needs one: Prepare writes ./etc/hosts) and /etc/ssl/certs (only with
// XDS_ROOT_CA=SYSTEM, unused here).
//
// # Users and writable paths
//
// By default the container runs as uid/gid 1337, as Istio's injector sets
// it (runAsUser 1337, readOnlyRootFilesystem). The tree is owned by root and
// read-only to others except the directories in Proxy.Writable, which in a
// real pod are emptyDir volumes and here are owned by 1337:
// ./etc/istio/proxy, ./var/run/secrets/workload-spiffe-uds,
// ./var/run/secrets/credential-uds, ./var/run/secrets/workload-spiffe-credentials
// and ./var/lib/istio/data (which also holds the stand-in's record). That is
// enough for pilot-agent to run and become ready as 1337: the tests check it.
// With plain namespaces, every directory above Root must also be searchable
// by uid 1337 (Proxy.Command checks this).
//
// # No control plane
//
// No istiod runs. pilot-agent keeps retrying the CA and the XDS upstream
// forever, which does not keep it from becoming ready with the stand-in.
// Config.DiscoveryAddress defaults to localhost:15012, so those retries stay
// on the loopback interface: no DNS query, no packet leaves the namespace.
package istioproxy
