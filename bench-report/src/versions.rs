//! What the report says about when and from what it was made: the time, and the versions of
//! the workspace's crates and of cudarc that were built, read from the workspace's
//! `Cargo.lock` (as TOML) when the report was compiled.

use serde::Deserialize;

/// The workspace's `Cargo.lock` as it was when this crate was built.
const BUILT_LOCK: &str = include_str!("../../Cargo.lock");

#[derive(Deserialize)]
struct Lock {
    #[serde(default)]
    package: Vec<Package>,
}

#[derive(Deserialize)]
struct Package {
    name: String,
    version: String,
}

/// The version of package `name` in the lock file `lock`, or `None` when it has none.
pub fn locked_version(lock: &str, name: &str) -> Result<Option<String>, toml::de::Error> {
    let lock: Lock = toml::from_str(lock)?;
    Ok(lock
        .package
        .into_iter()
        .find(|p| p.name == name)
        .map(|p| p.version))
}

/// The version of package `name` that this build of the workspace locked.
pub fn built_version(name: &str) -> Option<String> {
    locked_version(BUILT_LOCK, name).ok().flatten()
}

/// `YYYY-MM-DD HH:MM UTC` for seconds since the Unix epoch.
pub fn utc_timestamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(utc_timestamp(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_timestamp(951_782_400 + 3_661), "2000-02-29 01:01 UTC");
        assert_eq!(utc_timestamp(1_798_761_600), "2027-01-01 00:00 UTC");
    }

    #[test]
    fn versions_from_a_lock_file() {
        let lock = "version = 4\n\n[[package]]\nname = \"cudarc\"\nversion = \"0.19.10\"\nsource = \"x\"\n\n[[package]]\nname = \"rand\"\nversion = \"0.9.5\"\ndependencies = [\"a\"]\n";
        assert_eq!(
            locked_version(lock, "cudarc").unwrap().as_deref(),
            Some("0.19.10")
        );
        assert_eq!(
            locked_version(lock, "rand").unwrap().as_deref(),
            Some("0.9.5")
        );
        assert_eq!(locked_version(lock, "serde").unwrap(), None);
        assert!(locked_version("[[package]\n", "x").is_err());
    }

    #[test]
    fn this_build_locked_its_own_crates() {
        assert_eq!(
            built_version("bench-report").as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert!(built_version("cudarc").is_some());
    }
}
