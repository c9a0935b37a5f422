// celery_outbox: the API's Swagger UI (/docs), from the package's own copy of Swagger UI. A
// file of its own, not an inline script: the Content-Security-Policy allows scripts of this
// origin only.
(function () {
  "use strict";
  const root = document.getElementById("swagger-ui");
  window.ui = window.SwaggerUIBundle({
    url: root.dataset.openapi,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    validatorUrl: null,
    presets: [window.SwaggerUIBundle.presets.apis],
  });
})();
