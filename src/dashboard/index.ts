// The dashboard: Bull Board, the pipeline page, its JSON API and /metrics.
export { DASHBOARD_USER } from './auth.js';
export { type Dashboard, startDashboard } from './server.js';
