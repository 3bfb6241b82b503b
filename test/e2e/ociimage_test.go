package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// ociImageTar writes an OCI image layout tarball holding rootfs as one
// layer, with entrypoint, named name (io.containerd.image.name), for
// `ctr images import`: an image without any registry.
func ociImageTar(t *testing.T, rootfs, name string, entrypoint []string, out string) {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	err := filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == rootfs {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(rootfs, p)
		hdr.Name = rel
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatalf("layer of %s: %v", rootfs, err)
	}

	blobs := map[string][]byte{}
	add := func(b []byte) map[string]any {
		sum := sha256.Sum256(b)
		dg := "sha256:" + hex.EncodeToString(sum[:])
		blobs[hex.EncodeToString(sum[:])] = b
		return map[string]any{"digest": dg, "size": len(b)}
	}
	mustJSON := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	layerDesc := add(layer.Bytes())
	layerDesc["mediaType"] = "application/vnd.oci.image.layer.v1.tar"
	config := add(mustJSON(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Entrypoint": entrypoint},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc["digest"].(string)}},
	}))
	config["mediaType"] = "application/vnd.oci.image.config.v1+json"
	manifest := add(mustJSON(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": config, "layers": []any{layerDesc},
	}))
	manifest["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
	manifest["annotations"] = map[string]string{"io.containerd.image.name": name}
	manifest["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}

	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ow := tar.NewWriter(f)
	put := func(name string, b []byte) {
		if err := ow.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := ow.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	put("index.json", mustJSON(map[string]any{"schemaVersion": 2, "manifests": []any{manifest}}))
	for hexDigest, b := range blobs {
		put("blobs/sha256/"+hexDigest, b)
	}
	if err := ow.Close(); err != nil {
		t.Fatal(err)
	}
}
