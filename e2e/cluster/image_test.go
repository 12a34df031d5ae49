package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scripts"
)

// TestDockerfileTranslation checks that build-image.sh builds the image the
// Dockerfile describes: the runtime stage it derives is the Dockerfile's last
// stage line for line, with only `COPY --from=build /SRC` turned into `COPY
// SRC`, and the compile step is the build stage's RUN line; and that it
// refuses Dockerfile shapes it cannot translate faithfully rather than
// building something else. Needs no root and builds nothing.
func TestDockerfileTranslation(t *testing.T) {
	scriptsDir, err := scripts.Dir()
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(scriptsDir, "..", "..", "Dockerfile")

	t.Run("repo Dockerfile", func(t *testing.T) {
		src, err := os.ReadFile(real)
		if err != nil {
			t.Fatal(err)
		}
		out, err := checkTranslation(t, scriptsDir, real)
		if err != nil {
			t.Fatalf("build-image.sh --check: %v\n%s", err, out)
		}
		stages := regexp.MustCompile(`(?mi)^FROM\s`).FindAllStringIndex(string(src), -1)
		if len(stages) < 2 {
			t.Fatalf("Dockerfile has %d stages, want a build and a runtime stage", len(stages))
		}
		runtime := string(src[stages[len(stages)-1][0]:])
		want := regexp.MustCompile(`(?m)^COPY --from=build /`).ReplaceAllString(runtime, "COPY ")
		if !strings.Contains(out, strings.TrimRight(want, "\n")) {
			t.Errorf("derived Containerfile differs from the Dockerfile's runtime stage.\nwant (contained):\n%s\ngot:\n%s", want, out)
		}
		run := regexp.MustCompile(`(?m)^RUN (CGO_ENABLED=0 GOOS=\$TARGETOS GOARCH=\$TARGETARCH go build .*)$`).FindStringSubmatch(string(src))
		if run == nil || !strings.Contains(out, "# "+run[1]+"\n") {
			t.Errorf("compile step not taken from the Dockerfile's go build line %q:\n%s", run, out)
		}
		if strings.Contains(out, "--from") {
			t.Errorf("derived Containerfile still copies from another stage:\n%s", out)
		}
	})

	const (
		from  = "FROM --platform=$BUILDPLATFORM golang:1.26 AS build\n"
		build = from + "RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -o /out/x ./cmd/x\n"
	)
	for _, tc := range []struct{ name, dockerfile, wantErr string }{
		{"copy from an image", build + "FROM scratch AS runtime\nCOPY --from=busybox:1.37 /bin/sh /sh\n", "COPY/ADD other than"},
		{"ADD in runtime", build + "FROM scratch\nADD https://example.invalid/x /x\n", "COPY/ADD other than"},
		{"runtime not scratch", build + "FROM debian:12\nCOPY --from=build /out/x /x\n", "not FROM scratch"},
		{"RUN in runtime", build + "FROM scratch\nCOPY --from=build /out/x /x\nRUN [\"/x\"]\n", "RUN step"},
		{"compile split over lines", from + "RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build \\\n  -o /out/x ./cmd/x\nFROM scratch\n", "on one line"},
		{"compile elsewhere than /out", from + "RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -o /x ./cmd/x\nFROM scratch\n", "must read"},
		{"compile for the build machine only", from + "RUN CGO_ENABLED=0 go build -o /out/x ./cmd/x\nFROM scratch\n", "must read"},
		{"build stage emulated per target", "FROM golang:1.26 AS build\nRUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -o /out/x ./cmd/x\nFROM scratch\n", "--platform=$BUILDPLATFORM"},
		{"no build stage", "FROM --platform=$BUILDPLATFORM golang:1.26 AS compile\nRUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -o /out/x .\nFROM scratch\n", "no stage named 'build'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "Dockerfile")
			if err := os.WriteFile(f, []byte(tc.dockerfile), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := checkTranslation(t, scriptsDir, f)
			if err == nil {
				t.Fatalf("build-image.sh --check accepted it:\n%s", out)
			}
			if !strings.Contains(out, tc.wantErr) {
				t.Errorf("error does not mention %q:\n%s", tc.wantErr, out)
			}
		})
	}
}

func checkTranslation(t *testing.T, scripts, dockerfile string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(scripts, "build-image.sh"), "--check")
	cmd.Env = append(os.Environ(), "SUPERVISOR_DOCKERFILE="+dockerfile)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
