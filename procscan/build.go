package procscan

import (
	"sort"
)

// builder groups processes into containers as they come, in any order,
// by Classify's rules, keeping of each container what Container holds and
// the little its kind is decided from. A scan of the pod thus holds one
// group per distinct cgroup content, not one value per process.
type builder struct {
	self  int
	rules Rules
	// live are the containers that hold a live process, by cgroup content.
	live map[string]*group
	// exiting holds, by cgroup content, the exiting processes of a content
	// no live process has shown yet: where they go is known only once
	// every live process has been seen (see Classify, and pod).
	exiting map[string]*group
	// keep makes every group keep all its processes (all), for the tests
	// that check where each one went.
	keep bool
}

// group is one container being built, or exiting processes of one cgroup
// content waiting to be placed.
type group struct {
	id    string
	count int
	// oldest is its oldest process by older; its main process when its
	// PPID is 0. Its Comm and Argv0 are views of buf (see keepOldest).
	oldest Process
	buf    []byte
	// first is its lowest PID, which orders containers without a main
	// process.
	first int
	// self and one: it holds the supervisor, PID 1.
	self, one bool
	// main: it holds a PPID-0 process.
	main bool
	// named are its processes named like a sidecar (rules.Sidecar): its
	// strays, unless it is a sidecar's or the supervisor's container.
	named []Process
	all   []Process
}

func newBuilder(self int, rules Rules) *builder {
	return &builder{self: self, rules: rules, live: map[string]*group{}, exiting: map[string]*group{}}
}

// add places one process. An exiting process whose content is a live
// container's joins it at once: nothing seen later can change that.
func (b *builder) add(p Process) {
	g := b.live[p.Cgroup]
	if g == nil {
		m := b.live
		if p.Exiting {
			m = b.exiting
		}
		if g = m[p.Cgroup]; g == nil {
			g = &group{id: p.Cgroup}
			m[p.Cgroup] = g
		}
	}
	g.add(p, b)
}

// add counts p in g. p's strings may be views of a reader's buffers
// (Scanner.each): what g keeps of it, it keeps as p.owned(), or copied
// into its own buffer.
func (g *group) add(p Process, b *builder) {
	if g.count == 0 || older(p, g.oldest) {
		g.keepOldest(p)
	}
	if g.count == 0 || p.PID < g.first {
		g.first = p.PID
	}
	g.count++
	g.self = g.self || p.PID == b.self
	g.one = g.one || p.PID == 1
	g.main = g.main || p.PPID == 0
	if p.Matches(b.rules.Sidecar) {
		g.named = append(g.named, p.owned())
	}
	if b.keep {
		g.all = append(g.all, p.owned())
	}
}

// keepOldest makes p g's oldest process, its strings copied into g's
// buffer: in a listing not in start order (a fixture tree, PIDs that
// wrapped) the oldest changes often, and each change then costs no
// allocation once the buffer is large enough. Nothing but g.oldest may
// view buf, which the next change overwrites; the pod gets a copy.
func (g *group) keepOldest(p Process) {
	g.buf = append(append(g.buf[:0], p.Comm...), p.Argv0...)
	p.Comm, p.Argv0 = view(g.buf[:len(p.Comm)]), view(g.buf[len(p.Comm):])
	g.oldest = p
}

// merge moves the exiting processes of e into g: they are g's now, and
// carry its content as their Cgroup.
func (g *group) merge(e *group) {
	if older(e.oldest, g.oldest) {
		// A view of e's buffer, which nothing writes any more.
		g.oldest = e.oldest
		g.oldest.Cgroup = g.id
	}
	g.first = min(g.first, e.first)
	g.count += e.count
	g.self, g.one, g.main = g.self || e.self, g.one || e.one, g.main || e.main
	for _, p := range e.named {
		p.Cgroup = g.id
		g.named = append(g.named, p)
	}
	for _, p := range e.all {
		p.Cgroup = g.id
		g.all = append(g.all, p)
	}
}

// place puts the exiting processes waiting in b.exiting where Classify
// says: in the container whose content they share, else in the only live
// one whose unified ("0::") line they share; failing both, processes of a
// content that includes an exiting main process (PPID 0) are a container
// of their own, and those of any other content are left out. One content
// at a time: its processes all go to the same place.
func (b *builder) place() {
	// Live containers by unified line; nil when two share it (the line
	// does not tell them apart).
	unified := map[string]*group{}
	for _, g := range b.live {
		u, ok := unifiedLine(g.id)
		if !ok {
			continue
		}
		if _, dup := unified[u]; dup {
			unified[u] = nil
		} else {
			unified[u] = g
		}
	}
	for id, e := range b.exiting {
		g := b.live[id]
		if g == nil {
			if u, ok := unifiedLine(id); ok {
				g = unified[u]
			}
		}
		switch {
		case g != nil:
			g.merge(e)
		case e.main:
			b.live[id] = e
		}
	}
	b.exiting = map[string]*group{}
}

// pod places what is left and says what each container is.
func (b *builder) pod() Pod {
	b.place()
	// The pause container is the reference for where the pod's containers
	// live in each cgroup hierarchy (see Settled).
	var pauseCgroup string
	if b.self != 1 {
		for _, g := range b.live {
			if g.one {
				pauseCgroup = g.id
			}
		}
	}
	type entry struct {
		c     Container
		first int
	}
	entries := make([]entry, 0, len(b.live))
	for _, g := range b.live {
		oldest := g.oldest.owned()
		c := Container{ID: g.id, Name: containerName(g.id), Count: g.count, Processes: []Process{oldest}}
		first := g.first
		if oldest.PPID == 0 {
			c.Main, c.HasMain = oldest, true
			first = oldest.PID
		}
		switch {
		case g.self:
			c.Kind = Self
		case g.one:
			c.Kind = Pause
		case c.HasMain && !Settled(c.ID, pauseCgroup, c.Main.Exiting):
			c.Kind = Starting
		case c.HasMain && c.Main.Matches(b.rules.Sidecar):
			c.Kind = Sidecar
		case c.HasMain && c.Main.Matches(b.rules.Ignore):
			c.Kind = Ignored
		case c.HasMain && runtimeInit(c.Main):
			c.Kind, c.Init = Starting, true
		default:
			c.Kind = App
		}
		if c.Kind != Sidecar && c.Kind != Self && len(g.named) > 0 {
			c.Stray = g.named
			sort.Slice(c.Stray, func(i, j int) bool { return c.Stray[i].PID < c.Stray[j].PID })
		}
		entries = append(entries, entry{c, first})
	}
	// By main process, else lowest PID: distinct, as no process is in two
	// containers; by ID after that, so that even an input with a PID twice
	// (never /proc's) gives one order.
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].first != entries[j].first {
			return entries[i].first < entries[j].first
		}
		return entries[i].c.ID < entries[j].c.ID
	})
	pod := Pod{Containers: make([]Container, len(entries))}
	for i, e := range entries {
		pod.Containers[i] = e.c
	}
	return pod
}
