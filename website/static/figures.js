// Draw every plotly figure of the page from the JSON the build put beside its <div>.
document.querySelectorAll('script[type="application/json"][data-for]').forEach((el) => {
  const div = document.getElementById(el.dataset.for);
  const fig = JSON.parse(el.textContent);
  Plotly.newPlot(div, fig.data || [], fig.layout || {},
                 Object.assign({ responsive: true }, fig.config || {}));
});
