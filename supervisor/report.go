package supervisor

import (
	"errors"
	"io/fs"
	"os"
)

// maxTerminationMessage is the kubelet's limit: it keeps the last 4096
// bytes of a container's termination-message file (pkg/util/tail's
// ReadAtMost), so a longer file loses its start, the outcome.
const maxTerminationMessage = 4096

// WriteTerminationMessage writes the summary where the kubelet reads the
// container's termination message, so `kubectl describe pod` shows it. The
// kubelet creates that file in every container; a missing file means we are
// not in such a container (or the path points elsewhere): not an error,
// reported as written=false, and nothing is created.
func WriteTerminationMessage(path, summary string) (written bool, err error) {
	if path == "" {
		return false, nil
	}
	if len(summary)+len("\n") > maxTerminationMessage {
		summary = summary[:maxTerminationMessage-len("...\n")] + "..."
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// Written over what is there, then cut to its length; not truncated
	// first. The file is rewritten as the run goes (its progress), and a
	// supervisor killed between a truncation and the write after it left
	// it empty, which the kubelet replaces with the log's last lines
	// (soak seed 20261219, Job 32). Killed between these two steps, it
	// leaves the new text first and the old one's tail after it.
	text := summary + "\n"
	if _, err := f.WriteAt([]byte(text), 0); err != nil {
		f.Close()
		return false, err
	}
	if err := f.Truncate(int64(len(text))); err != nil {
		f.Close()
		return false, err
	}
	return true, f.Close()
}
