use super::*;

#[test]
fn canonical_quantities_read_as_counts() {
    let table = [
        ("1000", Some(1000)),
        ("1k", Some(1000)),
        ("2k", Some(2000)),
        ("1e3", Some(1000)),
        ("1E3", Some(1000)),
        ("0", Some(0)),
        ("1Ki", Some(1024)),
        ("1.5k", Some(1500)),
        ("500m", Some(1)),
        ("1500m", Some(2)),
        ("2000m", Some(2)),
        ("1M", Some(1_000_000)),
        ("3", Some(3)),
        ("", None),
        ("k", None),
        ("abc", None),
        ("1x", None),
        ("1.2.3", None),
        ("8Ei", None),
        ("1e99", None),
    ];
    for (q, want) in table {
        assert_eq!(count(q), want, "{q}");
    }
}

#[test]
fn exactness_tells_a_fraction_from_a_whole_number() {
    assert!(is_exactly("1k", 1000));
    assert!(is_exactly("2000m", 2));
    assert!(!is_exactly("1500m", 2));
    assert!(!is_exactly("garbage", 0));
}
