package supervisor

import (
	"fmt"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// fastInterval is how often, while the apps are looked for, the kernel's
// last PID is read (Scanner.LastPID: one small read) to scan at once when
// a process or thread has been made in the pod; and how often a container
// being set up is scanned again, for startingHot after it was first seen,
// until the kubelet's mount names it (procscan.Pod.Name), or, an app
// adopted as its runtime's init, until its exec is seen. A container's
// main process exists from the runtime's init on, tens of milliseconds
// before its entrypoint runs: scanned this often, an app of a few
// milliseconds is adopted before it runs, where a scan every ScanInterval
// would miss it, and its exec is seen.
const (
	fastInterval = 2 * time.Millisecond
	startingHot  = 2 * time.Second
)

// look is how the run looks for containers: a scan every ScanInterval
// (tick), and, where the kernel's last PID can be read, a read of it every
// fastInterval (fast) that scans at once when it has moved, or while a
// container seen being set up is still hot (startingHot; run.starting,
// which outlives a look: an app adopted from its runtime's init in
// discovery stays hot in the wait). Discovery looks for the apps this
// way, and the wait for their restarts: a restart is as visible as a
// first start, adopted while the runtime's init stands in for it, however
// short the run that follows.
type look struct {
	r     *run
	tick  *time.Ticker
	fastT *time.Ticker
	fast  <-chan time.Time
	last  int
}

// adoptedInit marks the app instance id as adopted from its runtime's
// init (ledger.adoptedInit), its container as being set up (settingUp):
// looked at closely until its exec is seen.
func (r *run) adoptedInit(id instance) {
	r.apps.adoptedInit(id)
	r.settingUp(id, time.Now())
}

// settingUp keeps when the container of main process k was first seen
// being set up.
func (r *run) settingUp(k instance, now time.Time) {
	if r.starting == nil {
		r.starting = map[instance]time.Time{}
	}
	if _, ok := r.starting[k]; !ok {
		r.starting[k] = now
	}
}

func (r *run) newLook() *look {
	lk := &look{r: r, tick: time.NewTicker(r.cfg.ScanInterval)}
	last, err := r.scan.LastPID()
	if err == nil && r.cfg.ScanInterval > fastInterval {
		lk.last = last
		lk.fastT = time.NewTicker(fastInterval)
		lk.fast = lk.fastT.C
	}
	return lk
}

func (lk *look) stop() {
	lk.tick.Stop()
	if lk.fastT != nil {
		lk.fastT.Stop()
	}
}

// moved reports whether a fast tick at now calls for a scan: the last PID
// moved, or a container being set up is hot. A failed read leaves it to
// the tick.
func (lk *look) moved(now time.Time) bool {
	n, err := lk.r.scan.LastPID()
	if err == nil && n != lk.last {
		lk.last = n
		return true
	}
	for _, t := range lk.r.starting {
		if now.Sub(t) < startingHot {
			return true
		}
	}
	return false
}

// scan reads the pod, keeps the containers being set up, calls each
// container's see (may be nil) and adopts what is new: the apps it could
// watch are returned.
func (lk *look) scan(now time.Time, see func(procscan.Container, time.Time)) ([]watchedApp, error) {
	pod, err := lk.r.scan.Scan()
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	live := map[instance]bool{}
	for _, c := range pod.Containers {
		if see != nil {
			see(c, now)
		}
		if c.HasMain && (c.Kind == procscan.Starting || c.Init) {
			k := instanceOf(c.Main)
			live[k] = true
			lk.r.settingUp(k, now)
		}
	}
	for k := range lk.r.starting {
		if !live[k] {
			delete(lk.r.starting, k)
		}
	}
	return lk.r.adopt(pod), nil
}
