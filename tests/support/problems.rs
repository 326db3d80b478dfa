//! Checks of the API's error answers: RFC 9457 problem+json bodies, built by the service in
//! one place, so every suite checks them alike.

use serde_json::Value;

/// A problem answered with status `want`: the status in the body too, and its `type`,
/// `title` and `detail` given.
pub fn assert_problem(status: u16, body: &Value, want: u16) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["status"], want, "{body}");
    for field in ["type", "title", "detail"] {
        assert!(body[field].is_string(), "problem without {field}: {body}");
    }
}

/// [`assert_problem`] of an answer as the test app's requests return it: (status, body).
pub fn assert_answer_is_problem((status, body): (u16, Value), want: u16) {
    assert_problem(status, &body, want);
}

/// A 422 `invalid-field` problem whose detail says `says`.
pub fn assert_422_saying(status: u16, body: &Value, says: &str) {
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["type"], "/problems/invalid-field", "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains(says), "{detail:?} does not say {says:?}");
}
