//! Resource versions as numbers, to tell which of two copies of an object is newer.

/// An etcd revision, the form every resourceVersion takes with the API server's storage. One in
/// another form cannot be compared, so it is never waited for.
pub fn revision(rv: Option<&str>) -> Option<u64> {
    rv?.parse().ok()
}
