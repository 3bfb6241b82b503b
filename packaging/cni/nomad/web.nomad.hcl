# A Nomad job on isolatord's CNI network "isolator"
# (/opt/cni/config/isolator.conflist). Each allocation shares the node's IP
# address and owns its ports. isolatord does no NAT, so the task listens on
# the port Nomad picked (NOMAD_PORT_http), and the port has no "to" (or a
# "to" equal to its static value).
job "web" {
  group "web" {
    count = 2

    network {
      mode = "cni/isolator"

      # Dynamic: Nomad picks it from min_dynamic_port..max_dynamic_port,
      # which must lie inside isolatord's --ports (see client.hcl).
      port "http" {}

      # 31443 is held *shared* by every allocation of this group on a node;
      # their servers bind it with SO_REUSEPORT and isolatord spreads new
      # flows across them. It is not declared as a Nomad port: Nomad would
      # then refuse to place two allocations on one node, and
      # ignore_collision is not allowed with cni/* networks. Nomad 1.9+
      # passes cni.args to the plugin as CNI_ARGS.
      cni {
        args = {
          ISOLATOR_SHARED_PORTS = "31443"
        }
      }
    }

    task "server" {
      driver = "exec"
      config {
        command = "/usr/local/bin/my-server"
        args    = ["--listen", ":${NOMAD_PORT_http}", "--quic", ":31443", "--reuseport"]
      }
    }
  }
}
