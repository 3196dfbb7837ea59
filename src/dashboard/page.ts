/**
 * The pipeline page: a static HTML, JavaScript and CSS page (no build step) in `public/`, next
 * to this file in src/ and in dist/ (scripts/copy-assets.mjs copies it). It holds no token: the
 * browser sends the basic-auth credentials it asked the user for.
 */
import { fileURLToPath } from 'node:url';
import express, { type Router } from 'express';

/** Folder of the page's files. */
export const PUBLIC_DIR = fileURLToPath(new URL('./public/', import.meta.url));

/**
 * The headers of Bull Board at `/queues`: the page's policy, except that Bull Board's own page
 * needs inline styles (its `<style>` and React's style attributes); its Google Fonts link is
 * refused, so it shows in the browser's fonts and the dashboard loads nothing from elsewhere.
 */
export function bullBoardHeaders(): express.RequestHandler {
  return (_req, res, next) => {
    res.setHeader(
      'content-security-policy',
      "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; font-src 'self' data:; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'",
    );
    res.setHeader('x-content-type-options', 'nosniff');
    res.setHeader('x-frame-options', 'DENY');
    res.setHeader('referrer-policy', 'same-origin');
    next();
  };
}

/** Serves the page at `/` (and its files), with a policy that allows only its own scripts and styles. */
export function pageRoutes(): Router {
  const router = express.Router();
  router.use(
    express.static(PUBLIC_DIR, {
      index: 'index.html',
      redirect: false,
      setHeaders: (res) => {
        res.setHeader(
          'content-security-policy',
          "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'",
        );
        res.setHeader('x-content-type-options', 'nosniff');
        res.setHeader('cache-control', 'no-cache');
      },
    }),
  );
  return router;
}
