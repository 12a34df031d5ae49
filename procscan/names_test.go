package procscan

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestName: with the kubelet's names, kinds come from the pod spec's names:
// a native sidecar and a debug container are Other, another pod's
// container too, and a container not yet started stays Starting, unless its
// runtime's init is already named an app: then it is the app, watched from
// before its entrypoint runs.
func TestName(t *testing.T) {
	const other = "0f3c5a2b-0000-0000-0000-000000000000"
	cg := func(id string) string { return "0::/../" + id }
	procs := []Process{
		{PID: 1, StartTime: 1, Comm: "pause", Cgroup: cg("pause")},
		{PID: 7, StartTime: 2, Comm: "otelcol", Cgroup: cg("c7")},
		{PID: 8, StartTime: 3, Comm: "python3", Cgroup: cg("c8")},
		{PID: 9, StartTime: 4, Comm: "sh", Cgroup: cg("c9")},
		{PID: 10, StartTime: 5, Comm: "sidecar-supervi", Cgroup: cg("c10")},
		{PID: 11, StartTime: 6, Comm: "pilot-agent", Cgroup: cg("c11")},
		{PID: 12, StartTime: 7, Comm: "sleep", Cgroup: cg("c12")},
		{PID: 13, StartTime: 8, Comm: "runc:[2:INIT]", Cgroup: cg("c13")},
		{PID: 14, StartTime: 9, Comm: "pilot-agent", Cgroup: cg("c14")},
		{PID: 15, StartTime: 10, Comm: "mystery", Cgroup: cg("c15")},
		{PID: 16, StartTime: 11, Comm: "sleep", Cgroup: cg("c16")}, // an app at its exit: no mounts left
		{PID: 17, StartTime: 12, Comm: "runc:[2:INIT]", Cgroup: cg("c17")},
		{PID: 18, StartTime: 13, Comm: "runc:[2:INIT]", Cgroup: cg("c18")},
	}
	names := map[int]Kube{
		7: {"otel-collector", uid}, 8: {"worker", uid}, 9: {"loader", uid}, 10: {"sidecar-supervisor", uid},
		11: {"istio-proxy", uid}, 12: {"debugger-x7k2p", uid}, 13: {"late", uid}, 14: {"istio-proxy", other},
		17: {"vault-agent", uid},
	}
	rules := NameRules{PodUID: uid, Apps: []string{"worker", "loader", "late", "later"}, Sidecars: []string{"istio-proxy", "vault-agent"}}
	pod := Classify(procs, 10, Rules{Sidecar: []string{"pilot-agent"}})
	pod.Name(func(pid int) (Kube, bool) { return names[pid], pid == 16 }, rules)
	got := map[string]string{}
	for _, c := range pod.Containers {
		got[c.Name] = c.Kind.String()
	}
	want := map[string]string{
		"pause": "pause", "otel-collector": "other", "worker": "app", "loader": "app", "sidecar-supervisor": "self",
		"istio-proxy": "sidecar", "debugger-x7k2p": "other", "late": "app", "c15": "other", "c16": "app",
		"vault-agent": "starting", "c18": "starting", // a sidecar's init waits for its exec; one not yet named too
	}
	// Another pod's istio-proxy is Other too, under the same name.
	for _, c := range pod.Containers {
		if c.Main.PID == 14 && (c.Kind != Other || c.Why == "") {
			t.Errorf("another pod's istio-proxy is %s (%s)", c.Kind, c.Why)
		}
	}
	delete(got, "istio-proxy")
	delete(want, "istio-proxy")
	for _, c := range pod.Containers {
		if c.Main.PID == 11 && c.Kind != Sidecar {
			t.Errorf("our istio-proxy is %s", c.Kind)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}

	// Without an app list the process rules stand, and names only name.
	pod = Classify(procs, 10, Rules{Sidecar: []string{"pilot-agent"}})
	pod.Name(func(pid int) (Kube, bool) { return names[pid], false }, NameRules{PodUID: uid, Sidecars: []string{"istio-proxy"}})
	for _, c := range pod.Containers {
		if c.Main.PID == 12 && (c.Name != "debugger-x7k2p" || c.Kind != App) {
			t.Errorf("without app names: %s is %s", c.Name, c.Kind)
		}
	}
	// Without the supervisor's own name (another runtime), nothing changes.
	pod = Classify(procs, 10, Rules{Sidecar: []string{"pilot-agent"}})
	before := pod.Containers[2]
	pod.Name(func(pid int) (Kube, bool) { return names[pid], false }, NameRules{})
	if pod.Containers[2].Name != before.Name {
		t.Errorf("names applied without the pod's UID")
	}
}
