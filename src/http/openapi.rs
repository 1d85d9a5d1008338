//! The OpenAPI 3 document served at `/openapi.json`.
//!
//! Kept by hand next to the router; a test compares its paths and methods with
//! [`super::router::ROUTES`], so a route cannot be added or removed without the document.

pub const DOCUMENT: &str = include_str!("openapi.json");

#[cfg(test)]
mod tests {
    use super::super::parse::Method;
    use super::super::router::ROUTES;
    use super::DOCUMENT;
    use std::collections::BTreeSet;

    /// The document describes exactly the router's paths and methods (HEAD and OPTIONS are
    /// implied, as HTTP defines them).
    #[test]
    fn document_matches_the_router() {
        let doc: serde_json::Value = serde_json::from_str(DOCUMENT).expect("valid JSON");
        assert_eq!(
            doc["openapi"].as_str().map(|v| v.starts_with("3.")),
            Some(true)
        );
        let paths = doc["paths"].as_object().expect("paths");
        let documented: BTreeSet<(String, String)> = paths
            .iter()
            .flat_map(|(p, item)| {
                item.as_object()
                    .unwrap()
                    .keys()
                    .map(move |m| (p.clone(), m.to_uppercase()))
            })
            .collect();
        let served: BTreeSet<(String, String)> = ROUTES
            .iter()
            .flat_map(|r| {
                r.methods
                    .iter()
                    .filter(|m| **m != Method::Head)
                    .map(|m| (r.path.to_string(), m.as_str().to_string()))
            })
            .collect();
        assert_eq!(documented, served, "openapi.json and the router disagree");
    }
}
