# Nomad client settings for isolatord's CNI network. Nomad allocates the host
# ports, so its dynamic port range must lie inside isolatord's --ports (here
# isolatord runs with --ports 31000-31999) and must not overlap isolatord's
# --ephemeral-ports.
client {
  cni_path       = "/opt/cni/bin"
  cni_config_dir = "/opt/cni/config"

  min_dynamic_port = 31000
  max_dynamic_port = 31999
}
