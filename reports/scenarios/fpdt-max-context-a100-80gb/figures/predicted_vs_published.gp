set terminal pngcairo size 1100,680 noenhanced font ',11'
set output 'predicted_vs_published.png'
set title ARG1
set logscale xy 10
set format x '%.0s%c'
set format y '%.0s%c'
set xtics (200000, 500000, 1000000, 2000000, 5000000, 10000000)
set ytics (200000, 500000, 1000000, 2000000, 5000000, 10000000)
set xrange [183500.8:12111052.799999999]
set yrange [183500.8:12111052.799999999]
set xlabel 'published maximum sequence length (tokens)'
set ylabel 'predicted maximum sequence length (tokens)'
set grid
set key below
set bmargin 6
plot x with lines lc rgb 'gray' lw 2 title 'y = x (predicted equals published)', 'predicted_vs_published.dat' using 1:2 with points pt 7 ps 1.6 title 'a published figure (label: its row of the sweep)', '' using 1:2:3 with labels offset 1,0.8 font ',8' notitle
set terminal svg size 1100,680 noenhanced font ',11'
set output 'predicted_vs_published.svg'
replot
unset output
