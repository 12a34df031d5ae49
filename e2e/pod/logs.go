package pod

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
)

// Logs returns everything the container has written so far, across
// restarts.
func (p *Pod) Logs(name string) string {
	i := p.index(name)
	if i < 0 {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, l := range p.initLogs {
			if l.name == name {
				return l.String()
			}
		}
		return ""
	}
	return p.logs[i].String()
}

// Describe is the pod's status and every container's logs, for a failing
// test to print.
func (p *Pod) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s (%s backend): %s\n", p.Spec.Name, p.Backend.Name(), p.Status())
	p.mu.Lock()
	initErr := p.initErr
	p.mu.Unlock()
	if initErr != nil {
		fmt.Fprintf(&b, "--- %v\n", initErr)
	}
	for _, c := range p.Spec.InitContainers {
		fmt.Fprintf(&b, "--- init container %s logs:\n%s", c.Name, p.Logs(c.Name))
	}
	for _, c := range p.Spec.Containers {
		fmt.Fprintf(&b, "--- %s logs:\n%s", c.Name, p.Logs(c.Name))
		if m := p.TerminationMessage(c.Name); m != "" {
			fmt.Fprintf(&b, "--- %s termination message: %s\n", c.Name, m)
		}
	}
	if d, ok := p.Backend.(Describer); ok {
		fmt.Fprintf(&b, "--- %s backend:\n%s", p.Backend.Name(), d.Describe(p))
	}
	return b.String()
}

// Describer is a Backend that can tell more about a pod's containers (its
// runtime's view, the processes' states) for Describe.
type Describer interface {
	Describe(p *Pod) string
}

// hook runs a hook (postStart, preStop) in container i, its output into
// the container's log, prefixed and ended with a newline so that the
// container's next line stays apart, and its failure after it.
func (p *Pod) hook(ctx context.Context, i int, name string, argv []string) error {
	out, err := p.Backend.Exec(ctx, p, &p.Spec.Containers[i], p.attempt(i), argv)
	p.logHook(i, name, out, err)
	return err
}

// logHook writes what a hook or probe printed to container i's log.
func (p *Pod) logHook(i int, name string, out []byte, err error) {
	b := append([]byte("["+name+"] "), out...)
	if !bytes.HasSuffix(b, []byte("\n")) {
		b = append(b, '\n')
	}
	if err != nil {
		b = fmt.Appendf(b, "[%s failed: %v]\n", name, err)
	}
	p.logs[i].Write(b)
}

// logBuffer keeps a container's output and streams it, line-prefixed.
type logBuffer struct {
	name   string
	stream io.Writer
	// written is called after each write (Pod.notify).
	written func()
	mu      sync.Mutex
	buf     bytes.Buffer
	line    []byte
}

func (l *logBuffer) Write(b []byte) (int, error) {
	l.mu.Lock()
	l.buf.Write(b)
	if l.stream != nil {
		l.line = append(l.line, b...)
		for i := bytes.IndexByte(l.line, '\n'); i >= 0; i = bytes.IndexByte(l.line, '\n') {
			fmt.Fprintf(l.stream, "%-18s| %s\n", l.name, l.line[:i])
			l.line = l.line[i+1:]
		}
	}
	l.mu.Unlock()
	// Outside l.mu: Pod.Logs reads an init container's log under the
	// pod's lock, which written takes.
	l.written()
	return len(b), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
