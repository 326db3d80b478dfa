//! Tests that need something this machine may not have (Java and Maven for a real
//! Elasticsearch, `python3`, libfaketime). Under CI they must run, so a missing tool fails
//! them; elsewhere they skip and say so loudly, in a banner that names the tool and how to
//! install it. `.ci/run` installs every one of them.

/// Whether this run is CI's: `CI` set to anything but empty, `0` or `false`.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !["", "0", "false"].contains(&v.as_str()))
}

/// Says loudly that `what` does not run here and why (`missing`, and how to get it); panics
/// instead under CI, where every test must run.
pub fn or_fail_under_ci(what: &str, missing: &str) {
    assert!(
        !under_ci(),
        "{what} must run under CI, but {missing} (.ci/run installs it)"
    );
    eprintln!("\n*** SKIPPED: {what}: {missing} ***\n");
}

/// Whether `tool` is an executable file on the `PATH`.
pub fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false)
}
