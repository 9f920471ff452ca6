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
            assert_eq!(p.media_extensions, p.name.contains("+me"), "{}: {}", m.name, p.name);
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
        Some(ProfileName { compute_slices: 3, memory_gb: 40, media_extensions: false, suffix: "" })
    );
    for bad in ["", "g.10gb", "3g.gb", "3x.40gb", "3g.40", "3g.40gb+xx", "99999g.1gb"] {
        assert_eq!(parse_profile_name(bad), None, "{bad:?}");
    }
}

#[test]
fn new_boards_are_found_by_nvml_name_gfd_label_and_pci_id() {
    for (query, want) in [
        ("NVIDIA GB200", "GB200-186GB"),
        ("NVIDIA B300 SXM6 AC", "B300-269GB"),
        ("NVIDIA GB300", "GB300-278GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-96GB"),
        ("NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition", "RTX-PRO-6000-96GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000-96GB"),
        ("NVIDIA RTX PRO 5000 Blackwell", "RTX-PRO-5000-48GB"),
        ("NVIDIA RTX PRO 4500 Blackwell", "RTX-PRO-4500-32GB"),
        ("NVIDIA H20", "H100-96GB"),
        ("NVIDIA H800", "H100-80GB"),
        ("NVIDIA A800-SXM4-80GB", "A100-80GB"),
        ("NVIDIA-A800-SXM4-40GB", "A100-40GB"),
    ] {
        assert_eq!(lookup(query).map(|m| m.name), Some(want), "{query}");
    }
    // mig-parted's device-filter ids.
    for (id, want) in [
        (0x2941, "GB200-186GB"),
        (0x3182, "B300-269GB"),
        (0x31C2, "GB300-278GB"),
        (0x2BB5, "RTX-PRO-6000-96GB"),
        (0x2329, "H100-96GB"),
        (0x2324, "H100-80GB"),
        (0x20F3, "A100-80GB"),
        (0x20F6, "A100-40GB"),
    ] {
        assert_eq!(lookup_pci(id).map(|m| m.name), Some(want), "{id:#x}");
    }
}

#[test]
fn every_pci_id_and_name_belongs_to_one_board() {
    let mut ids = std::collections::BTreeSet::new();
    let mut keys = std::collections::BTreeSet::new();
    for m in MODELS {
        for id in m.pci_device_ids {
            assert!(ids.insert(id), "{id:#x} listed twice");
        }
        for n in m.nvml_names.iter().chain([&m.name]) {
            assert!(keys.insert(normalize_product(n)), "{n} listed twice");
        }
        assert!(m.source.len() > 20, "{} names its source", m.name);
    }
}

#[test]
fn rtx_pro_6000_matches_the_lgip_dump() {
    // nvidia-smi mig -lgip on an RTX PRO 6000 Blackwell (GoogleCloudPlatform/container-engine-accelerators#564).
    let m = lookup("RTX-PRO-6000-96GB").unwrap();
    let got: Vec<_> = m.profiles.iter().map(|p| (p.name, p.id, p.max_count, p.memory_slices)).collect();
    let want = vec![
        ("1g.24gb", 14, 4, 1),
        ("1g.24gb+me", 21, 1, 1),
        ("1g.24gb+gfx", 47, 4, 1),
        ("1g.24gb+me.all", 65, 1, 1),
        ("1g.24gb-me", 67, 4, 1),
        ("2g.48gb", 5, 2, 2),
        ("2g.48gb+gfx", 35, 2, 2),
        ("2g.48gb+me.all", 64, 1, 2),
        ("2g.48gb-me", 66, 2, 2),
        ("4g.96gb", 0, 1, 4),
        ("4g.96gb+gfx", 32, 1, 4),
    ];
    assert_eq!(got, want);
    assert_eq!((m.memory_slots, m.compute_slices), (4, 4));
}

#[test]
fn gfx_and_media_variants_parse_and_map_to_device_plugin_resources() {
    for (nvml, resource, media, suffix) in [
        ("1g.24gb+gfx", "nvidia.com/mig-1g.24gb.gfx", false, "+gfx"),
        ("1g.24gb+me.all", "nvidia.com/mig-1g.24gb.me.all", true, "+me.all"),
        ("1g.24gb-me", "nvidia.com/mig-1g.24gb-me", false, "-me"),
        ("4g.96gb+gfx", "nvidia.com/mig-4g.96gb.gfx", false, "+gfx"),
    ] {
        let parsed = parse_profile_name(nvml).unwrap_or_else(|| panic!("{nvml} parses"));
        assert_eq!((parsed.media_extensions, parsed.suffix), (media, suffix), "{nvml}");
        assert_eq!(mig_resource_name(nvml), resource);
        assert_eq!(profile_of_resource(resource).as_deref(), Some(nvml));
        assert_eq!(normalize_profile(&nvml.replace('+', ".")), nvml, "resource spelling normalizes");
        assert!(lookup("RTX-PRO-6000-96GB").unwrap().profile(&nvml.to_uppercase()).is_some(), "{nvml}");
    }
    assert!(has_resource_suffix("1g.24gb.gfx") && has_resource_suffix("1g.10gb.me"));
    assert!(!has_resource_suffix("1g.24gb+gfx") && !has_resource_suffix("1g.24gb-me"));
    for bad in ["1g.24gb+gfx+me", "1g.24gb-gfx", "1g.24gb+all", "1g.24gbgfx", "+gfx"] {
        assert_eq!(parse_profile_name(bad), None, "{bad:?}");
    }
}

/// README.md's "MIG geometry" section lists the boards: exactly the catalog's.
#[test]
fn readme_lists_exactly_the_catalog_boards() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let section = readme.split("## MIG geometry").nth(1).expect("a MIG geometry section");
    let list = section.split("covers").nth(1).and_then(|s| s.split(':').next()).expect("a `covers ...:` list");
    let named: std::collections::BTreeSet<&str> =
        list.split([',', ' ', '\n']).filter(|w| !w.is_empty() && *w != "and").collect();
    let catalog: std::collections::BTreeSet<&str> = MODELS.iter().map(|m| m.name).collect();
    assert_eq!(named, catalog);
}
