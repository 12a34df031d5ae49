package scenarios

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// cue makes app a's FIFO at host path and returns the arguments that make
// podsim app wait on it (at path as the container sees it).
func (b *Built) cue(a App, host, path string) ([]string, error) {
	if !a.Cued {
		return nil, nil
	}
	if err := unix.Mkfifo(host, 0o666); err != nil {
		return nil, fmt.Errorf("mkfifo %s: %w", host, err)
	}
	// Apps run as several uids.
	if err := os.Chmod(host, 0o666); err != nil {
		return nil, err
	}
	if b.cues == nil {
		b.cues = map[string]string{}
	}
	b.cues[a.Name] = host
	return []string{"--fifo", path}, nil
}

// handlerCue makes the stand-in's handler cue when d asks for one, and
// returns its environment.
func (b *Built) handlerCue(d Desc, host, path string) ([]string, error) {
	if !d.ProxyHandlerCued {
		return nil, nil
	}
	if _, err := b.cue(App{Name: HandlerCue, Cued: true}, host, path); err != nil {
		return nil, err
	}
	return []string{"PILOT_HANDLER_CUE=" + path}, nil
}

// Release lets the cued app name end: it opens the app's FIFO for writing
// and closes it, which waits (up to 30s) for the app to be waiting on it.
func (b Built) Release(name string) error {
	path, ok := b.cues[name]
	if !ok {
		return fmt.Errorf("app %q is not cued", name)
	}
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0) // blocks until the app reads
		if err == nil {
			err = f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		// Unblock the opener with a reader of our own.
		if f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
			<-done
			f.Close()
		}
		return fmt.Errorf("app %s never waited for its cue within 30s", name)
	}
}
