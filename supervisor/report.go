package supervisor

import (
	"errors"
	"io/fs"
	"os"
)

// maxTerminationMessage is the kubelet's limit: it keeps the first 4096
// bytes of a container's termination message.
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
	if len(summary) > maxTerminationMessage {
		summary = summary[:maxTerminationMessage-3] + "..."
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := f.WriteString(summary + "\n"); err != nil {
		f.Close()
		return false, err
	}
	return true, f.Close()
}
