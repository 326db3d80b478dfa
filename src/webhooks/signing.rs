//! The Standard Webhooks signature: `webhook-signature: v1,<base64 of HMAC-SHA256(key,
//! "<webhook-id>.<webhook-timestamp>.<body>")>`, with the key given as `whsec_<base64>`.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The prefix of a Standard Webhooks secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// The HMAC key of `WEBHOOK_SECRET`: the decoded bytes of `whsec_<base64>`. Never printed
/// (`Debug` shows `***`).
#[derive(Clone)]
pub struct WebhookSecret(Vec<u8>);

/// Keys shorter than this are refused: 128 bits is the least an HMAC-SHA256 key should have
/// (Standard Webhooks recommends 24 to 64 bytes).
pub const MIN_KEY_BYTES: usize = 16;

impl FromStr for WebhookSecret {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let encoded = text.trim().strip_prefix(SECRET_PREFIX).ok_or_else(|| {
            format!(
                "must start with `{SECRET_PREFIX}` (the Standard Webhooks form whsec_<base64 key>)"
            )
        })?;
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| format!("the part after `{SECRET_PREFIX}` is not standard base64"))?;
        if key.len() < MIN_KEY_BYTES {
            return Err(format!(
                "the key is {} bytes; at least {MIN_KEY_BYTES} are needed",
                key.len()
            ));
        }
        Ok(Self(key))
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl WebhookSecret {
    /// The value of the `webhook-signature` header for one attempt.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vector published with the Standard Webhooks specification (its libraries'
    /// "sign function works" tests).
    #[test]
    fn signs_the_standard_webhooks_test_vector() {
        let secret: WebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let signature = secret.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        // Any change of id, timestamp or body changes it.
        assert_ne!(
            secret.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJel",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            signature
        );
        assert_ne!(
            secret.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265331,
                br#"{"test": 2432232314}"#
            ),
            signature
        );
        assert_ne!(
            secret.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test":2432232314}"#
            ),
            signature
        );
    }

    #[test]
    fn secrets_must_be_whsec_base64_of_at_least_16_bytes() {
        for (bad, why) in [
            ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_"),
            ("whsec_not base64!", "base64"),
            ("whsec_", "0 bytes"),
            ("whsec_c2hvcnQ=", "5 bytes"),
        ] {
            let error = bad.parse::<WebhookSecret>().unwrap_err();
            assert!(error.contains(why), "{bad}: {error}");
        }
        let secret: WebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        assert_eq!(secret.0.len(), 24);
        assert_eq!(format!("{secret:?}"), "***");
    }
}
