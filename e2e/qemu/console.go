package qemu

import (
	"bytes"
	"sync"
	"time"
)

// consoleWriter collects qemu's serial output, cleans it line by line and
// keeps them. It notes when /init's
// release line went by, which ends the boot.
type consoleWriter struct {
	mu      sync.Mutex
	start   time.Time
	partial []byte
	buf     bytes.Buffer
	boot    time.Duration
}

func (c *consoleWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partial = append(c.partial, p...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			break
		}
		c.line(c.partial[:i+1])
		c.partial = c.partial[i+1:]
	}
	return len(p), nil
}

func (c *consoleWriter) line(raw []byte) {
	clean := cleanConsole(raw)
	if c.boot == 0 && bytes.HasPrefix(clean, []byte(markRelease)) {
		c.boot = time.Since(c.start)
	}
	c.buf.Write(clean)
}

func (c *consoleWriter) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.partial) > 0 {
		c.line(append(c.partial, '\n'))
		c.partial = nil
	}
}

func (c *consoleWriter) text() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

func (c *consoleWriter) bootAt() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.boot
}

// cleanConsole drops CRs, terminal escape sequences (CSI "ESC [ ... final"
// and two-byte "ESC x") and other control bytes except tab and newline,
// which the serial line carries alongside the text.
func cleanConsole(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		switch ch := b[i]; {
		case ch == 0x1b:
			if i+1 < len(b) && b[i+1] == '[' {
				// Parameters and intermediates run until a final byte in @..~.
				j := i + 2
				for j < len(b) && b[j] >= 0x20 && b[j] < 0x40 {
					j++
				}
				if j < len(b) && b[j] >= 0x40 && b[j] <= 0x7e {
					i = j
				} else {
					i = j - 1 // malformed: drop what was read, keep the rest
				}
			} else {
				i++ // ESC and the byte after it
			}
		case ch == '\n' || ch == '\t' || ch >= 0x20 && ch != 0x7f:
			out = append(out, ch)
		}
	}
	return out
}
