//! Run ids as clients may write them: the 32-hex form the server hands out, or the hyphenated
//! UUID of a Judge0 token, in either case (SPEC section 12).

/// The run id a client's id names, as the server keeps it (32 lowercase hex digits); `None`
/// when it is not a UUID in either form.
pub(crate) fn run_id_of(given: &str) -> Option<String> {
    let t = given.trim();
    (t.len() == 32 || t.len() == 36)
        .then(|| uuid::Uuid::parse_str(t).ok())
        .flatten()
        .map(|u| u.simple().to_string())
}

/// `run_id_of`, or the id as given when it is no UUID (the run manager then says it is
/// unknown).
pub fn run_id(given: &str) -> String {
    run_id_of(given).unwrap_or_else(|| given.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_of_a_uuid_name_the_same_run() {
        let simple = "0b6d2c4e8f0a4b1c9d3e5f7a9b1c3d5e";
        let hyphenated = "0b6d2c4e-8f0a-4b1c-9d3e-5f7a9b1c3d5e";
        assert_eq!(run_id(simple), simple);
        assert_eq!(run_id(hyphenated), simple);
        assert_eq!(run_id(&hyphenated.to_uppercase()), simple);
        assert_eq!(run_id("nope"), "nope");
        assert_eq!(run_id_of("nope"), None);
    }
}
