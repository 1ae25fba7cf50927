"""The kubelet's DRA health APIs (KEP-4680): ``v1`` (kubelet 1.37+) and ``v1alpha1`` (1.34 to 1.39)."""
