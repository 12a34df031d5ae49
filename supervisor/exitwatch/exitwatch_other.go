//go:build !linux

package exitwatch

import (
	"errors"
	"fmt"
	"time"
)

// Watcher is Linux-only.
type Watcher struct{}

// New fails: pidfds and ptrace are Linux's.
func New(cfg Config) (*Watcher, Choice, error) {
	return nil, Choice{}, fmt.Errorf("watching another container's processes needs Linux: %w", errors.ErrUnsupported)
}

// Method, Watch, Track, Recorded, Anchor, CanAnchor and Close exist so that the package builds.
func (w *Watcher) Method() Method { return None }

func (w *Watcher) Watch(p Process) (Proc, error) { return nil, errors.ErrUnsupported }

func (w *Watcher) Track(p Process) (Proc, error) { return nil, errors.ErrUnsupported }

func (w *Watcher) Recorded(p Process) (Status, time.Time, bool) { return Status{}, time.Time{}, false }

func (w *Watcher) Anchor(p Process) (bool, error) { return false, nil }

func (w *Watcher) CanAnchor() bool { return false }

func (w *Watcher) Close() error { return nil }
