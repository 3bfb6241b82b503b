package e2e

// containerd 1.6's CRI plugin, driven the way kubelet drives it: a small
// client of k8s.io/cri-api over containerd's socket runs a pod sandbox with
// a port mapping, creates and starts a container in it, and stops and
// removes the sandbox. The sandbox ("pause") and container images are made
// locally from the busybox rootfs and imported (no registry); containerd has
// its own root, state, socket and CNI directories (the shipped conflist and
// isolator-cni plus the standard loopback plugin, which the CRI needs).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

const criImage = "localhost/isolatord-test/rootfs:1"

// TestContainerdCRI: RunPodSandbox with portMappings, CreateContainer,
// StartContainer: the container is reachable from the sandbox client on its
// hostPort, its pod labels are shown; StopPodSandbox and RemovePodSandbox
// leave nothing.
func TestContainerdCRI(t *testing.T) {
	needTools(t, "containerd", "ctr", "runc", "containerd-shim-runc-v2")
	if _, err := os.Stat("/usr/lib/cni/loopback"); err != nil {
		t.Skipf("the standard loopback CNI plugin is not installed (containernetworking-plugins): %v", err)
	}
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	base := readHostState(t, sb, d.NetNSDir)
	c := startContainerdWith(t, "k8s.io", d.Socket, func(c *containerd) string {
		bin := filepath.Join(c.optDir, "cni", "bin")
		copyFile(t, "/usr/lib/cni/loopback", filepath.Join(bin, "loopback"))
		return fmt.Sprintf(`[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
`, criImage, bin, c.confDir)
	})
	work := runtimeDir(t, "cri")
	rootfs := buildRootfs(t, work)
	img := filepath.Join(work, "image.tar")
	ociImageTar(t, rootfs, criImage, []string{"/bin/sleep", "2147483647"}, img)
	if out, err := c.ctr("images", "import", "--snapshotter", "native", img); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+c.address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rs := cri.NewRuntimeServiceClient(conn)
	var status *cri.StatusResponse
	wait.For(t, 30*time.Second, "CRI runtime ready", func() bool {
		status, err = rs.Status(ctx, &cri.StatusRequest{})
		return err == nil
	})

	podName := sb.Name + "-pod"
	sandboxConf := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: podName, Namespace: "default", Uid: sb.Name + "-uid", Attempt: 0},
		Hostname:     "web",
		LogDirectory: filepath.Join(work, "logs"),
		PortMappings: []*cri.PortMapping{{Protocol: cri.Protocol_TCP, ContainerPort: 31001, HostPort: 31001},
			{Protocol: cri.Protocol_UDP, ContainerPort: 31001, HostPort: 31001}},
		Linux: &cri.LinuxPodSandboxConfig{},
	}
	run, err := rs.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: sandboxConf})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v\nisolatord:\n%s", err, d.Log())
	}
	podID := run.GetPodSandboxId()
	t.Cleanup(func() {
		rs.StopPodSandbox(context.Background(), &cri.StopPodSandboxRequest{PodSandboxId: podID})
		rs.RemovePodSandbox(context.Background(), &cri.RemovePodSandboxRequest{PodSandboxId: podID})
	})
	created, err := rs.CreateContainer(ctx, &cri.CreateContainerRequest{
		PodSandboxId: podID,
		Config: &cri.ContainerConfig{
			Metadata: &cri.ContainerMetadata{Name: "server"},
			Image:    &cri.ImageSpec{Image: criImage},
			Command:  []string{"/isotraffic", "serve", "--tcp", ":31001", "--udp", ":31001", "--name", "criweb"},
			LogPath:  "server.log",
		},
		SandboxConfig: sandboxConf,
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := rs.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: created.GetContainerId()}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	wait.For(t, 30*time.Second, "CRI pod reachable on its hostPort 31001", func() bool {
		s, err := echoFromClient(sb, "tcp", 31001)
		return err == nil && s == "criweb"
	})
	mustEcho(t, sb, "udp", 31001, "criweb")

	// The CNI container id is the sandbox id; the pod's identity is in its labels.
	out := d.Ctl(t, "get", podID)
	for _, want := range []string{"cni.network=isolator", "cni.arg.K8S_POD_NAME=" + podName, "cni.arg.K8S_POD_NAMESPACE=default"} {
		if !strings.Contains(out, want) {
			t.Errorf("isolatorctl get %s lacks %s:\n%s", podID, want, out)
		}
	}
	// The CRI pins the sandbox's namespace itself (/run/netns/cni-*).
	var got ctlContainer
	d.CtlJSON(t, &got, "get", podID)
	if got.Netns != filepath.Join(d.NetNSDir, podID) {
		t.Errorf("isolatord's pin of %s is %s", podID, got.Netns)
	}

	if _, err := rs.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if cg := cniGet(t, d, podID); cg != nil {
		t.Errorf("StopPodSandbox left %s in isolatord", podID)
	}
	if _, err := rs.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	if after := readHostState(t, sb, d.NetNSDir); fmt.Sprint(after) != fmt.Sprint(base) {
		t.Errorf("the pod left kernel state behind:\nbefore %+v\nafter  %+v", base, after)
	}
	t.Logf("CRI network ready condition: %v", status.GetStatus().GetConditions())
}
