package scenarios

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// fifo makes the FIFO at host path that Release(name) opens.
func (b *Built) fifo(name, host string) error {
	if err := unix.Mkfifo(host, 0o666); err != nil {
		return fmt.Errorf("mkfifo %s: %w", host, err)
	}
	// Apps run as several uids.
	if err := os.Chmod(host, 0o666); err != nil {
		return err
	}
	if b.cues == nil {
		b.cues = map[string]string{}
	}
	b.cues[name] = host
	return nil
}

// appCues makes app a's FIFOs (App.Cued, App.DrainCued) in the shared
// directory, hostDir on the host and dir in the containers, and returns
// the arguments that make podsim app wait on them.
func (b *Built) appCues(a App, hostDir, dir string) ([]string, error) {
	var args []string
	if a.Cued {
		if err := b.fifo(a.Name, filepath.Join(hostDir, a.Name+".cue")); err != nil {
			return nil, err
		}
		args = append(args, "--fifo", dir+"/"+a.Name+".cue")
	}
	if a.DrainCued {
		if err := b.fifo(DrainCue(a.Name), filepath.Join(hostDir, a.Name+".drain.cue")); err != nil {
			return nil, err
		}
		args = append(args, "--on-term-until", dir+"/"+a.Name+".drain.cue")
	}
	return args, nil
}

// DrainCue is the name Built.Release takes for the end of app's drain
// (App.DrainCued).
func DrainCue(app string) string { return app + "/drain" }

// proxyCues makes the stand-in's cues d asks for (ProxyHandlerCued,
// ProxyDrainCued) in the shared directory, hostDir on the host and dir in
// the containers, and returns its environment.
func (b *Built) proxyCues(d Desc, hostDir, dir string) ([]string, error) {
	var env []string
	for _, c := range []struct {
		on        bool
		name, env string
	}{{d.ProxyHandlerCued, HandlerCue, "PILOT_HANDLER_CUE"}, {d.ProxyDrainCued, ProxyDrainCue, "PILOT_DRAIN_CUE"}} {
		if !c.on {
			continue
		}
		if err := b.fifo(c.name, filepath.Join(hostDir, c.name+".cue")); err != nil {
			return nil, err
		}
		env = append(env, c.env+"="+dir+"/"+c.name+".cue")
	}
	return env, nil
}

// Release lets the cued app name end: it opens the app's FIFO for writing
// and closes it, which waits for the app to be waiting on it (for up to
// releaseBound: a hang guard, as a container start on a loaded machine may
// take tens of seconds).
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
	case <-time.After(releaseBound):
		// Unblock the opener with a reader of our own.
		if f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
			<-done
			f.Close()
		}
		return fmt.Errorf("app %s never waited for its cue within %s", name, releaseBound)
	}
}

// releaseBound bounds Release's wait.
const releaseBound = 2 * time.Minute
