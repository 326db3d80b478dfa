//! Every route the API serves, in one list: what the `route` label of the metrics may say,
//! what the OpenAPI document must describe, what the auth suite checks on each protected
//! route, and where the strict-input suite sends unknown query parameters. A route added to the service and not here fails the OpenAPI check (every operation
//! of the document must be listed), so the other suites follow it.

/// What a route needs when the service has API keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Open to anyone (probes, metrics unless `METRICS_REQUIRE_AUTH`).
    Open,
    /// A key with the `read` scope.
    Read,
    /// A key with the `write` scope.
    Write,
}

/// One method on one route template.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub method: &'static str,
    pub template: &'static str,
    pub access: Access,
    /// Described in the OpenAPI document as this operation. `GET /transfers/batch` is not:
    /// it reads the transfer whose id is `batch`, which `GET /transfers/{id}` describes.
    pub documented: bool,
}

const fn route(method: &'static str, template: &'static str, access: Access) -> Route {
    Route {
        method,
        template,
        access,
        documented: true,
    }
}

pub const ROUTES: &[Route] = &[
    route("POST", "/accounts", Access::Write),
    route("GET", "/accounts/{id}", Access::Read),
    route("GET", "/accounts/{id}/entries", Access::Read),
    route("GET", "/accounts/{id}/balance", Access::Read),
    route("POST", "/transfers", Access::Write),
    route("GET", "/transfers", Access::Read),
    route("POST", "/transfers/batch", Access::Write),
    Route {
        method: "GET",
        template: "/transfers/batch",
        access: Access::Read,
        documented: false,
    },
    route("GET", "/transfers/{id}", Access::Read),
    route("POST", "/transfers/{id}/cancel", Access::Write),
    route("POST", "/transfers/{id}/capture", Access::Write),
    route("GET", "/events", Access::Read),
    route("GET", "/livez", Access::Open),
    route("GET", "/healthz", Access::Open),
    route("GET", "/readyz", Access::Open),
    route("GET", "/metrics", Access::Open),
];

/// Every route template, once each.
pub fn templates() -> Vec<&'static str> {
    let mut templates: Vec<&'static str> = Vec::new();
    for route in ROUTES {
        if !templates.contains(&route.template) {
            templates.push(route.template);
        }
    }
    templates
}

/// The routes that need a key when the service has keys.
pub fn protected() -> impl Iterator<Item = &'static Route> {
    ROUTES.iter().filter(|r| r.access != Access::Open)
}
