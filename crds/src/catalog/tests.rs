use super::*;

#[test]
fn lookup_accepts_short_nvml_and_gfd_names_case_insensitively() {
    for (query, want) in [
        ("H100-80GB", "H100-80GB"),
        ("h100-80gb", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("nvidia-h100-80gb-hbm3-SHARED", "H100-80GB"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB"),
        ("A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A30", "A30-24GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA H100 NVL", "H100-94GB"),
        ("NVIDIA B200", "B200-180GB"),
    ] {
        assert_eq!(lookup(query).map(|m| m.name), Some(want), "{query}");
    }
    assert!(lookup("NVIDIA RTX PRO 6000").is_none());
    assert!(lookup("").is_none());
}

#[test]
fn pci_lookup_uses_device_ids() {
    assert_eq!(lookup_pci(0x2330).map(|m| m.name), Some("H100-80GB"));
    assert_eq!(lookup_pci(0x20B7).map(|m| m.name), Some("A30-24GB"));
    assert!(lookup_pci(0x1234).is_none());
}

#[test]
fn every_model_is_internally_consistent() {
    for m in MODELS {
        let mut names = std::collections::BTreeSet::new();
        for p in m.profiles {
            assert!(names.insert(p.name), "{}: duplicate {}", m.name, p.name);
            assert!(parse_profile_name(p.name).is_some(), "{}: bad name {}", m.name, p.name);
            assert_eq!(
                parse_profile_name(p.name).unwrap().compute_slices,
                u32::from(p.compute_slices),
                "{}: {} compute slices disagree with its name",
                m.name,
                p.name
            );
            assert_eq!(p.media_extensions, p.name.ends_with("+me"), "{}: {}", m.name, p.name);
            assert!(!p.starts.is_empty() && p.max_count >= 1);
            for &s in p.starts {
                assert!(s + p.memory_slices <= m.memory_slots, "{}: {} start {s} out of bounds", m.name, p.name);
            }
            // A profile can never have more instances than it has placements.
            assert!(usize::from(p.max_count) <= p.starts.len(), "{}: {}", m.name, p.name);
        }
        assert!(m.profiles.iter().any(|p| p.compute_slices == m.compute_slices), "{} has a full-GPU profile", m.name);
    }
}

#[test]
fn h100_80gb_matches_the_table_read_from_real_hardware() {
    // docs/hardware/h100-80gb-hbm3.txt: nvidia-smi mig -lgip/-lgipp on driver 580.159.04.
    let m = lookup("NVIDIA H100 80GB HBM3").unwrap();
    let got: Vec<_> = m.profiles.iter().map(|p| (p.name, p.id, p.max_count, p.starts, p.memory_slices)).collect();
    let want: Vec<(&str, u32, u8, &[u8], u8)> = vec![
        ("1g.10gb", 19, 7, &[0, 1, 2, 3, 4, 5, 6], 1),
        ("1g.10gb+me", 20, 1, &[0, 1, 2, 3, 4, 5, 6], 1),
        ("1g.20gb", 15, 4, &[0, 2, 4, 6], 2),
        ("2g.20gb", 14, 3, &[0, 2, 4], 2),
        ("3g.40gb", 9, 2, &[0, 4], 4),
        ("4g.40gb", 5, 1, &[0], 4),
        ("7g.80gb", 0, 1, &[0], 8),
    ];
    assert_eq!(got, want);
}

#[test]
fn profile_names_and_resource_names_round_trip() {
    assert_eq!(mig_resource_name("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
    assert_eq!(mig_resource_name("3g.40gb"), "nvidia.com/mig-3g.40gb");
    assert_eq!(profile_of_resource("nvidia.com/mig-1g.10gb.me").as_deref(), Some("1g.10gb+me"));
    assert_eq!(profile_of_resource("nvidia.com/mig-3g.40gb").as_deref(), Some("3g.40gb"));
    assert_eq!(profile_of_resource("nvidia.com/gpu"), None);
    assert_eq!(profile_of_resource("nvidia.com/mig-3g"), None);
    assert_eq!(
        parse_profile_name("3g.40gb"),
        Some(ProfileName { compute_slices: 3, memory_gb: 40, media_extensions: false })
    );
    for bad in ["", "g.10gb", "3g.gb", "3x.40gb", "3g.40", "3g.40gb+xx", "99999g.1gb"] {
        assert_eq!(parse_profile_name(bad), None, "{bad:?}");
    }
}
