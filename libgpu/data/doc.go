// Package data owns datasets: the Fashion-MNIST IDX reader, pixel
// normalisation, seeded per-epoch shuffling and fixed-size batches; and
// text corpora for language models (a character tokenizer, the train and
// validation split, seeded random blocks).
//
// Files are the four IDX files of Fashion-MNIST (Xiao, Rasul & Vollgraf 2017,
// https://github.com/zalandoresearch/fashion-mnist), gzip'd or not; on Debian
// they come with the package dataset-fashion-mnist under DefaultDir. The IDX
// format is Yann LeCun's (http://yann.lecun.com/exdb/mnist/): a big-endian
// magic number whose third byte is the element type (0x08 = unsigned byte)
// and whose fourth is the number of dimensions, then one big-endian uint32
// per dimension, then the elements in row-major order.
package data
