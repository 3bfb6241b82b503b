# A Nomad job (tested with Nomad 1.6.0) on isolatord's CNI network
# "isolator-shared" (/opt/cni/config/isolator-shared.conflist). Each
# allocation shares the node's IP address and owns its ports. isolatord does
# no NAT, so the task listens on the port Nomad picked (NOMAD_PORT_http), and
# the port has no "to" (or a "to" equal to its static value). A job without
# shared ports uses "cni/isolator" (isolator.conflist) the same way.
job "web" {
  group "web" {
    count = 2

    network {
      # isolator-shared.conflist lists 31443 in "sharedPorts": every
      # allocation on this network holds it *shared*; their servers bind it
      # with SO_REUSEPORT and isolatord spreads new flows across them. 31443
      # is not declared as a Nomad port: Nomad would then refuse to place two
      # allocations on one node. (Nomad 1.9 and later can instead pass it per
      # job on the plain "isolator" network with
      #   cni { args = { ISOLATOR_SHARED_PORTS = "31443" } }
      # ignore_collision is not allowed with cni/* networks.)
      mode = "cni/isolator-shared"

      # Dynamic: Nomad picks it from min_dynamic_port..max_dynamic_port,
      # which must lie inside isolatord's --ports (see client.hcl). Held
      # exclusively.
      port "http" {}
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
