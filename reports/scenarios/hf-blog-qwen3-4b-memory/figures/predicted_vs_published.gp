set terminal pngcairo size 1100,680 noenhanced font ',11'
set output 'predicted_vs_published.png'
set title ARG1
set xrange [15.959999999999999:97.00759150505066]
set yrange [15.959999999999999:97.00759150505066]
set xlabel 'published peak memory (GiB)'
set ylabel 'predicted peak memory (GiB)'
set grid
set key below
set bmargin 6
plot x with lines lc rgb 'gray' lw 2 title 'y = x (predicted equals published)', 'predicted_vs_published.dat' using 1:2 with points pt 7 ps 1.6 title 'a published figure (label: its row of the sweep)', '' using 1:2:3 with labels offset 1,0.8 font ',8' notitle
set terminal svg size 1100,680 noenhanced font ',11'
set output 'predicted_vs_published.svg'
replot
unset output
