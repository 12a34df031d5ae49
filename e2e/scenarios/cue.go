package scenarios

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// fifo makes the FIFO at host path that Release(name) opens.
func (b *Built) fifo(name, host string) error {
	if err := pod.MakeCue(host); err != nil {
		return err
	}
	if b.cues == nil {
		b.cues = map[string]string{}
	}
	b.cues[name] = host
	return nil
}

// appCues makes app a's FIFOs (App.Cued, App.DrainCued) in the shared
// directory and returns the arguments that make podsim app wait on them.
func (b *Built) appCues(a App) ([]string, error) {
	hostDir, dir := b.Shared, b.sharedIn
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
// ProxyDrainCued) in the shared directory and returns its environment.
func (b *Built) proxyCues(d Desc) ([]string, error) {
	hostDir, dir := b.Shared, b.sharedIn
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
// and closes it, which waits for the app to be waiting on it
// (pod.ReleaseCue, for up to releaseBound: a hang guard, as a container
// start on a loaded machine may take tens of seconds).
func (b Built) Release(name string) error {
	path, ok := b.cues[name]
	if !ok {
		return fmt.Errorf("app %q is not cued", name)
	}
	if err := pod.ReleaseCue(path, releaseBound); err != nil {
		return fmt.Errorf("app %s: %w", name, err)
	}
	return nil
}

// releaseBound bounds Release's wait.
const releaseBound = 2 * time.Minute
