package plane

// Feature names reported in HostInfo.Features.
const (
	FeatureClsact = "clsact"
	FeatureU32    = "u32"
	FeatureMirred = "mirred"
	// FeatureHTB: the kernel has the HTB qdisc that bandwidth limits need.
	FeatureHTB     = "htb"
	FeatureTBF     = "tbf"
	FeatureIFB     = "ifb"
	FeatureFQCodel = "fq_codel"
	// FeatureClsBPF: the kernel loads the data plane's cls_bpf programs
	// (the drop sink's and the VLAN check).
	FeatureClsBPF = "cls_bpf"
)
