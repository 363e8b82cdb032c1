/* Appended to a copy of the HTML report by run.sh: moves the mouse over
 * the chart's peak marker (the circle at the peak's time and height), then
 * to the foot of the plot at the same x, and records what the hover's
 * read-out says at each (data-tip-peak, data-tip-foot on the body). */
(function () {
    var box = document.getElementById('chart');
    var svg = box.querySelector('svg');
    var mark = svg.querySelector('circle');
    var tip = document.getElementById('tip');
    var m = mark.getBoundingClientRect(), r = svg.getBoundingClientRect();
    var x = m.left + m.width / 2, y = m.top + m.height / 2;
    function at(cx, cy) {
        box.dispatchEvent(new MouseEvent('mousemove', {clientX: cx, clientY: cy, bubbles: true}));
        return tip.style.display === 'block' ? tip.textContent : '(no read-out)';
    }
    document.body.setAttribute('data-tip-peak', at(x, y));
    /* the plot's foot: y 490 of the 1040-unit-wide picture */
    document.body.setAttribute('data-tip-foot', at(x, r.top + 490 * r.width / 1040));
})();
