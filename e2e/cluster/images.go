package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"strings"
)

// ImportImage imports an OCI (or docker) image archive into the node's
// containerd, where the kubelet finds it without pulling (use an
// imagePullPolicy of IfNotPresent or Never, and a tag other than latest).
// Each alias becomes another name of the same image.
func (c *Cluster) ImportImage(ctx context.Context, archive string, aliases ...string) error {
	sock := c.Env["CONTAINERD_SOCK"]
	ctr := func(args ...string) error {
		args = append([]string{"--address", sock, "-n", "k8s.io"}, args...)
		out, err := exec.CommandContext(ctx, "ctr", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return nil
	}
	if err := ctr("images", "import", "--snapshotter", "overlayfs", archive); err != nil {
		return err
	}
	if len(aliases) == 0 {
		return nil
	}
	ref, err := archiveRef(archive)
	if err != nil {
		return err
	}
	for _, a := range aliases {
		if err := ctr("images", "tag", "--force", ref, a); err != nil {
			return err
		}
	}
	return nil
}

// Image is an image built for the cluster: its name and OCI archive.
type Image struct {
	Ref     string
	Archive string
}

// BuildSupervisorImage builds (or finds in the cache) the product image from
// the repo's Dockerfile with e2e/scripts/build-image.sh.
func (c *Cluster) BuildSupervisorImage(ctx context.Context) (Image, error) {
	out, err := c.runScript(ctx, "build-image.sh")
	if err != nil {
		return Image{}, fmt.Errorf("build-image.sh: %w", err)
	}
	env := parseEnv(out)
	return Image{Ref: env["SUPERVISOR_IMAGE"], Archive: env["SUPERVISOR_IMAGE_ARCHIVE"]}, nil
}

// BuildIstioProxyImage builds (or finds in the cache) the istio-proxy image:
// the real pilot-agent and the stand-in envoy.
func (c *Cluster) BuildIstioProxyImage(ctx context.Context) (Image, error) {
	out, err := c.runScript(ctx, "cluster-images.sh", "istio-proxy")
	if err != nil {
		return Image{}, fmt.Errorf("cluster-images.sh: %w", err)
	}
	env := parseEnv(out)
	return Image{Ref: env["ISTIO_PROXY_IMAGE"], Archive: env["ISTIO_PROXY_ARCHIVE"]}, nil
}

// CloudSQLProxyImage builds (or finds in the cache) the cloud-sql-proxy
// image: the real cloud-sql-proxy v2 of build-sidecars.sh in the layout of
// Google's image. It imports it into the node under its local name and under
// Google's (gcr.io/cloud-sql-connectors/cloud-sql-proxy:<version>, the name
// deploy/job-cloud-sql-proxy.yaml uses, found without a pull), and returns
// both.
func (c *Cluster) CloudSQLProxyImage(ctx context.Context) (ref, alias string, err error) {
	ref, alias, err = c.importImage(ctx, "cloud-sql-proxy", "CLOUD_SQL_PROXY")
	if err == nil && alias == "" {
		err = errors.New("cluster-images.sh cloud-sql-proxy printed no alias")
	}
	return ref, alias, err
}

// StandInsImage builds (or finds in the cache) the image of podsim's
// sidecar stand-ins (the Vault agent as /usr/local/bin/vault, with
// busybox's sh; daprd as /daprd; e2e/images/standins), imports it into the
// node and returns its name.
func (c *Cluster) StandInsImage(ctx context.Context) (string, error) {
	ref, _, err := c.importImage(ctx, "standins", "STANDINS")
	return ref, err
}

// importImage builds image name with cluster-images.sh, which prints
// <key>_IMAGE, _ARCHIVE and (for some) _ALIASES, and imports it into the
// node under its name and its alias.
func (c *Cluster) importImage(ctx context.Context, name, key string) (ref, alias string, err error) {
	out, err := c.runScript(ctx, "cluster-images.sh", name)
	if err != nil {
		return "", "", fmt.Errorf("cluster-images.sh: %w", err)
	}
	env := parseEnv(out)
	ref, archive, alias := env[key+"_IMAGE"], env[key+"_ARCHIVE"], env[key+"_ALIASES"]
	if ref == "" || archive == "" {
		return "", "", fmt.Errorf("cluster-images.sh %s printed no reference or archive: %q", name, out)
	}
	var aliases []string
	if alias != "" {
		aliases = append(aliases, alias)
	}
	if err := c.ImportImage(ctx, archive, aliases...); err != nil {
		return "", "", err
	}
	return ref, alias, nil
}

// ProductImages builds (or finds in the cache) the supervisor and istio-proxy
// images, imports both into the node, and returns their names.
func (c *Cluster) ProductImages(ctx context.Context) (supervisor, proxy string, err error) {
	for _, b := range []struct {
		build func(context.Context) (Image, error)
		ref   *string
	}{
		{c.BuildSupervisorImage, &supervisor},
		{c.BuildIstioProxyImage, &proxy},
	} {
		img, err := b.build(ctx)
		if err != nil {
			return "", "", err
		}
		if img.Ref == "" || img.Archive == "" {
			return "", "", fmt.Errorf("image build printed no reference or archive: %+v", img)
		}
		if err := c.ImportImage(ctx, img.Archive); err != nil {
			return "", "", err
		}
		*b.ref = img.Ref
	}
	return supervisor, proxy, nil
}

// archiveRef returns the image name recorded in an OCI archive's index.json
// (the org.opencontainers.image.ref.name annotation skopeo writes).
func archiveRef(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return "", fmt.Errorf("%s has no index.json: not an OCI archive", archive)
		}
		if err != nil {
			return "", fmt.Errorf("read %s: %w", archive, err)
		}
		if path.Clean(h.Name) != "index.json" {
			continue
		}
		var index struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&index); err != nil {
			return "", fmt.Errorf("%s: index.json: %w", archive, err)
		}
		for _, m := range index.Manifests {
			if ref := m.Annotations["org.opencontainers.image.ref.name"]; ref != "" {
				return ref, nil
			}
		}
		return "", fmt.Errorf("%s: index.json names no image", archive)
	}
}
